// The cluster presets. Peaks are the vendors' dense numbers; link bandwidths
// are per device and per direction (H100/H200 NVLink 4: 450 GB/s; A100
// NVLink 3: 300 GB/s; one 400 Gb/s NIC per H100/H200 and one 200 Gb/s NIC
// per A100). How much of it collectives achieve is a fitted constant, not a
// property of the preset.
#include "coordinator/planner/cluster.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;

std::vector<ClusterSpec> BuildPresets() {
  std::vector<ClusterSpec> presets;
  ClusterSpec h100;
  h100.name = "h100-sxm";
  h100.device_name = "NVIDIA H100 80GB HBM3";
  h100.peak_flops_fp32 = 67 * kTera;
  h100.peak_flops_bf16 = 989.5 * kTera;
  h100.peak_flops_fp8 = 1979 * kTera;
  h100.memory_bytes = 79.6 * kGiB;  // 81,559 MiB visible to CUDA
  h100.hbm_bandwidth = 3.35e12;
  h100.intra_node_bandwidth = 450 * kGiga;
  h100.inter_node_bandwidth = 50 * kGiga;
  presets.push_back(h100);

  ClusterSpec h200 = h100;
  h200.name = "h200";
  h200.device_name = "NVIDIA H200";
  h200.memory_bytes = 139.8 * kGiB;
  h200.hbm_bandwidth = 4.8e12;
  presets.push_back(h200);

  ClusterSpec a100;
  a100.name = "a100-80gb";
  a100.device_name = "NVIDIA A100-SXM4-80GB";
  a100.peak_flops_fp32 = 19.5 * kTera;
  a100.peak_flops_bf16 = 312 * kTera;
  a100.peak_flops_fp8 = 0;  // no fp8 units: falls back to bf16
  a100.memory_bytes = 79.2 * kGiB;
  a100.hbm_bandwidth = 2.0e12;
  a100.intra_node_bandwidth = 300 * kGiga;
  a100.inter_node_bandwidth = 25 * kGiga;
  presets.push_back(a100);

  // One CPU rank: a few cores of OpenBLAS, Gloo over loopback TCP. The peak
  // is a placeholder that the agent's measured value replaces.
  ClusterSpec cpu;
  cpu.name = "cpu";
  cpu.device_name = "CPU rank";
  cpu.is_cpu = true;
  cpu.peak_flops_fp32 = 50 * kGiga;
  cpu.memory_bytes = 8 * kGiB;
  cpu.hbm_bandwidth = 10 * kGiga;
  cpu.intra_node_bandwidth = 2 * kGiga;
  cpu.inter_node_bandwidth = 1 * kGiga;
  cpu.devices_per_node = 1;
  presets.push_back(cpu);
  return presets;
}

const std::vector<ClusterSpec>& Presets() {
  static const std::vector<ClusterSpec>* presets = new std::vector<ClusterSpec>(BuildPresets());
  return *presets;
}

}  // namespace

double ClusterSpec::PeakFlops(ComputeDtype dtype) const {
  switch (dtype) {
    case ComputeDtype::kFp8:
      if (peak_flops_fp8 > 0) return peak_flops_fp8;
      [[fallthrough]];
    case ComputeDtype::kBf16:
      if (peak_flops_bf16 > 0) return peak_flops_bf16;
      [[fallthrough]];
    case ComputeDtype::kFp32:
      break;
  }
  return peak_flops_fp32;
}

std::vector<std::string> ClusterPresetNames() {
  std::vector<std::string> names;
  for (const ClusterSpec& c : Presets()) names.push_back(c.name);
  return names;
}

absl::StatusOr<ClusterSpec> ClusterPreset(std::string_view name) {
  for (const ClusterSpec& c : Presets()) {
    if (c.name == name) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat("resources.gpu '", std::string(name),
                                                 "' is not a known device; known: ",
                                                 absl::StrJoin(ClusterPresetNames(), ", ")));
}

absl::StatusOr<ClusterSpec> ApplyOverrides(ClusterSpec c, const ClusterOverrides& o) {
  auto positive = [](const char* field, double v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("cluster.", field, "=", v, " must be positive"));
  };
  if (o.nodes) {
    if (auto s = positive("nodes", *o.nodes); !s.ok()) return s;
    c.nodes = *o.nodes;
  }
  if (o.devices_per_node) {
    if (auto s = positive("devices_per_node", *o.devices_per_node); !s.ok()) return s;
    c.devices_per_node = *o.devices_per_node;
  }
  if (o.peak_flops) {
    if (auto s = positive("peak_flops", *o.peak_flops); !s.ok()) return s;
    c.peak_flops_fp32 = c.peak_flops_bf16 = c.peak_flops_fp8 = *o.peak_flops;
  }
  if (o.memory_bytes) {
    if (auto s = positive("memory_bytes", *o.memory_bytes); !s.ok()) return s;
    c.memory_bytes = *o.memory_bytes;
  }
  if (o.intra_node_bandwidth) {
    if (auto s = positive("intra_node_bandwidth", *o.intra_node_bandwidth); !s.ok()) return s;
    c.intra_node_bandwidth = *o.intra_node_bandwidth;
  }
  if (o.inter_node_bandwidth) {
    if (auto s = positive("inter_node_bandwidth", *o.inter_node_bandwidth); !s.ok()) return s;
    c.inter_node_bandwidth = *o.inter_node_bandwidth;
  }
  return c;
}

}  // namespace loom::planner
