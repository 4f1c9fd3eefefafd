// What a node offers: parsing of --devices, GPU discovery through nvidia-smi,
// and the CPU's peak FLOP/s measured with a short OpenBLAS sgemm run. The
// parsing functions are pure; the probes touch the machine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom::agent {

// --devices=cpu:N | gpu
struct DeviceRequest {
  enum class Kind { kCpu, kGpu };
  Kind kind = Kind::kCpu;
  int cpu_count = 0;  // N for cpu:N
};
absl::StatusOr<DeviceRequest> ParseDevicesFlag(const std::string& value);

// One entry of the Device list sent at registration (mirrors loom.v1.Device).
struct DeviceInfo {
  std::string kind;  // cpu | gpu
  int count = 0;
  std::string name;
  int64_t memory_bytes = 0;  // per device
  double peak_flops = 0;     // per device
};

struct GpuInfo {
  std::string name;
  int64_t memory_bytes = 0;
};

// Parses `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader`
// output (memory with or without the " MiB" unit), one GPU per line.
absl::StatusOr<std::vector<GpuInfo>> ParseNvidiaSmiCsv(const std::string& text);

// Dense BF16 peak FLOP/s of a GPU model from its nvidia-smi name, read from
// the shared table (common/hardware/device_peaks.h); 0 when the model is not
// in the table or has no bf16 units: "unknown" to the coordinator.
double GpuPeakFlops(const std::string& name);

// GPUs of the same model folded into one DeviceInfo each, in first-seen order.
std::vector<DeviceInfo> GroupGpus(const std::vector<GpuInfo>& gpus);

// The CPU cores this process may run on (its affinity mask), at least 1.
int UsableCores();
int64_t HostMemoryBytes();
std::string CpuModelName();

// Threads each rank should use: cores / ranks on this node, at least 1.
int ThreadsPerRank(int cores, int ranks);

// Best fp32 sgemm rate (FLOP/s) of OpenBLAS with `threads` threads, measured
// for about `budget`.
double MeasureCpuFlops(int threads, absl::Duration budget = absl::Milliseconds(300));

// Runs nvidia-smi if it is on PATH; no GPUs (not an error) when it is absent
// or fails.
std::vector<GpuInfo> DetectGpus();

// The devices to register for a request: for cpu:N, N devices with the host
// memory split evenly and the measured per-device FLOP/s; for gpu, the GPUs
// found (an error naming --devices when there are none).
absl::StatusOr<std::vector<DeviceInfo>> ProbeDevices(const DeviceRequest& request);

}  // namespace loom::agent
