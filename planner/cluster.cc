// The cluster presets. Device peaks, memory, HBM and NVLink bandwidth come
// from the one peak table (common/hardware/device_peaks.h, documented in
// docs/gpu.md "Peak FLOP/s table"); what is a property of the cluster rather
// than the device stays here: one 400 Gb/s NIC per H100/H200 and one 200 Gb/s
// NIC per A100 (bandwidths per device and per direction). How much of a link
// collectives achieve is a fitted constant, not a property of the preset.
#include "planner/cluster.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text/safe_text.h"
#include "common/hardware/device_peaks.h"

namespace loom::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kGiga = 1e9;

ClusterSpec GpuPreset(std::string_view preset_name, std::string_view device_id,
                      double inter_node_bandwidth) {
  const hardware::DeviceSpec* device = hardware::DeviceById(device_id);
  // A preset naming a row the table lacks is a programming error
  // (tests/hardware checks that these rows exist).
  if (device == nullptr) std::abort();
  ClusterSpec c;
  c.name = std::string(preset_name);
  c.device_name = std::string(device->smi_name);
  c.peak_flops_fp32 = device->fp32;
  c.peak_flops_bf16 = device->bf16;
  c.peak_flops_fp8 = device->fp8;  // 0 (A100): PeakFlops falls back to bf16
  c.memory_bytes = device->memory_bytes;
  c.hbm_bandwidth = device->hbm_bandwidth;
  c.intra_node_bandwidth = device->nvlink_bandwidth;
  c.inter_node_bandwidth = inter_node_bandwidth;
  return c;
}

std::vector<ClusterSpec> BuildPresets() {
  std::vector<ClusterSpec> presets;
  presets.push_back(GpuPreset("h100-sxm", "h100-sxm", 50 * kGiga));
  presets.push_back(GpuPreset("h200", "h200", 50 * kGiga));
  presets.push_back(GpuPreset("a100-80gb", "a100-sxm4-80gb", 25 * kGiga));

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
    case ComputeDtype::kTf32:  // no preset records tf32: the fp32 rate
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
  return absl::InvalidArgumentError(absl::StrCat("resources.gpu '", SafeText(name, 64),
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
  if (o.host_memory_bytes) {
    if (auto s = positive("host_memory_bytes", *o.host_memory_bytes); !s.ok()) return s;
    c.host_memory_bytes = *o.host_memory_bytes;
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
