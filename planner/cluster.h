// Cluster descriptions for the planner: per-device peak FLOP/s by dtype,
// memory, HBM bandwidth and the bandwidth of the links a collective crosses
// (inside a node, between nodes). Presets for H100 SXM, H200, A100 80GB and
// CPU ranks, their device numbers read from common/hardware/device_peaks.h;
// every field can be overridden (CPU ranks report a measured peak).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/precision.h"

namespace loom::planner {

struct ClusterSpec {
  std::string name;
  std::string device_name;
  bool is_cpu = false;
  // Dense peak FLOP/s of one device (one rank).
  double peak_flops_fp32 = 0;
  double peak_flops_bf16 = 0;
  double peak_flops_fp8 = 0;
  double memory_bytes = 0;          // usable by one rank
  // Host memory of one node that ranks may fill (in-place recovery's
  // snapshots, docs/fault_tolerance.md); 0: not known, not checked. On CPU
  // ranks host memory is the device: memory_bytes holds it.
  double host_memory_bytes = 0;
  double hbm_bandwidth = 0;         // bytes/s, for the optimizer step
  double intra_node_bandwidth = 0;  // bytes/s per device per direction (NVLink)
  double inter_node_bandwidth = 0;  // bytes/s per device per direction (NIC share)
  int64_t devices_per_node = 8;
  int64_t nodes = 1;

  int64_t world_size() const { return devices_per_node * nodes; }
  // Falls back to the next wider dtype when a device has no such unit.
  double PeakFlops(ComputeDtype dtype) const;
};

// Presets: h100-sxm, h200, a100-80gb, cpu. Node count 1; set `nodes` after.
absl::StatusOr<ClusterSpec> ClusterPreset(std::string_view name);
std::vector<std::string> ClusterPresetNames();

struct ClusterOverrides {
  std::optional<int64_t> nodes;
  std::optional<int64_t> devices_per_node;
  // Replaces the peak of every dtype (a CPU agent measures one number).
  std::optional<double> peak_flops;
  std::optional<double> memory_bytes;
  std::optional<double> host_memory_bytes;  // per node
  std::optional<double> intra_node_bandwidth;
  std::optional<double> inter_node_bandwidth;
};

// Rejects non-positive values, naming the field.
absl::StatusOr<ClusterSpec> ApplyOverrides(ClusterSpec cluster, const ClusterOverrides& overrides);

}  // namespace loom::planner
