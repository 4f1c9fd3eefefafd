// The one table of accelerator peaks: dense FLOP/s by dtype, plus the memory
// and bandwidths the planner's presets use, looked up by the device name as
// nvidia-smi prints it. The node agent (registration, MFU) and the planner
// (cluster presets) both read it; docs/gpu.md "Peak FLOP/s table" lists the
// values and their sources. Std-only and pure.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace loom::hardware {

// The arithmetic a GEMM runs in. kTf32 is fp32 storage on the tensor cores
// (10-bit mantissa inputs); kFp32 is the plain vector rate.
enum class Dtype { kFp32, kTf32, kBf16, kFp8 };
inline constexpr Dtype kAllDtypes[] = {Dtype::kFp32, Dtype::kTf32, Dtype::kBf16, Dtype::kFp8};

std::string_view DtypeName(Dtype dtype);  // fp32 | tf32 | bf16 | fp8
std::optional<Dtype> ParseDtype(std::string_view name);

struct DeviceSpec {
  std::string_view id;            // stable key, e.g. "h100-sxm"
  std::string_view display_name;  // e.g. "H100 SXM"
  std::string_view smi_name;      // how nvidia-smi names it, e.g. "NVIDIA H100 80GB HBM3"
  // Words that must all appear in a name for it to denote this device (the
  // first entry, in table order, whose words all appear wins).
  std::string_view match_words;   // e.g. "H100 PCIE"
  // Dense (no 2:4 sparsity) peaks in FLOP/s at the boost clock. 0 means the
  // device has no units for that dtype (an A100 has no fp8), never "unknown".
  double fp32 = 0;
  double tf32 = 0;
  double bf16 = 0;
  double fp8 = 0;
  // Recorded for the devices the planner has a preset for; 0 elsewhere (use
  // what nvidia-smi reports).
  double memory_bytes = 0;  // usable by CUDA on one device
  // 0 where not recorded.
  double hbm_bandwidth = 0;     // device memory, bytes/s
  double nvlink_bandwidth = 0;  // per device, per direction, bytes/s (0: PCIe card)

  // The dense peak for `dtype`, or 0 when the device has no such unit.
  double PeakFlops(Dtype dtype) const;
};

// Every device in the table, most specific names first.
std::span<const DeviceSpec> AllDevices();

// The device an nvidia-smi name denotes, or nullptr when it is not in the
// table. Matching is on whole words, case-insensitive, with '-', '_' and
// spaces as separators and the "NVIDIA"/"Tesla" prefixes ignored: "NVIDIA H100
// 80GB HBM3" and "H100 SXM5 80GB" are the H100 SXM, "NVIDIA H100 PCIe" the
// PCIe card, "NVIDIA A100-SXM4-80GB" the A100 SXM4 80GB; "H20" is not "H200".
const DeviceSpec* FindDevice(std::string_view smi_name);

// By stable id ("h100-sxm", "h200", "a100-sxm4-80gb", ...), or nullptr.
const DeviceSpec* DeviceById(std::string_view id);

// The dense peak of `smi_name` in `dtype`. nullopt when the device is not in
// the table or has no units for that dtype (FindDevice tells which): callers
// must not invent a number (the agent reports 0, "unknown", to the coordinator).
std::optional<double> DensePeakFlops(std::string_view smi_name, Dtype dtype);

}  // namespace loom::hardware
