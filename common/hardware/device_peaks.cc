// The values are the vendors' datasheet numbers; docs/gpu.md "Peak FLOP/s
// table" names the datasheet of each row. Datasheets print tensor-core rates
// "with sparsity"; the dense rate stored here is half of that. Memory is what
// CUDA can use (nvidia-smi's memory.total less the driver's reserve), the
// number the planner budgets against.
#include "common/hardware/device_peaks.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace loom::hardware {
namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Most specific first: "H100 PCIE" must be tried before "H100".
constexpr DeviceSpec kDevices[] = {
    {.id = "h100-pcie", .display_name = "H100 PCIe", .smi_name = "NVIDIA H100 PCIe",
     .match_words = "H100 PCIE", .fp32 = 51 * kTera, .tf32 = 378 * kTera, .bf16 = 756 * kTera,
     .fp8 = 1513 * kTera, .hbm_bandwidth = 2.0e12},
    {.id = "h100-nvl", .display_name = "H100 NVL", .smi_name = "NVIDIA H100 NVL",
     .match_words = "H100 NVL", .fp32 = 60 * kTera, .tf32 = 417.5 * kTera, .bf16 = 835.5 * kTera,
     .fp8 = 1670.5 * kTera, .hbm_bandwidth = 3.9e12},
    {.id = "h100-sxm", .display_name = "H100 SXM", .smi_name = "NVIDIA H100 80GB HBM3",
     .match_words = "H100", .fp32 = 67 * kTera, .tf32 = 494.5 * kTera, .bf16 = 989.5 * kTera,
     .fp8 = 1979 * kTera, .memory_bytes = 79.6 * kGiB, .hbm_bandwidth = 3.35e12,
     .nvlink_bandwidth = 450 * kGiga},
    {.id = "gh200", .display_name = "GH200 (Hopper part)", .smi_name = "NVIDIA GH200 480GB",
     .match_words = "GH200", .fp32 = 67 * kTera, .tf32 = 494.5 * kTera, .bf16 = 989.5 * kTera,
     .fp8 = 1979 * kTera},
    {.id = "h200-nvl", .display_name = "H200 NVL", .smi_name = "NVIDIA H200 NVL",
     .match_words = "H200 NVL", .fp32 = 60 * kTera, .tf32 = 417.5 * kTera, .bf16 = 835.5 * kTera,
     .fp8 = 1670.5 * kTera, .hbm_bandwidth = 4.8e12},
    {.id = "h200", .display_name = "H200 SXM", .smi_name = "NVIDIA H200", .match_words = "H200",
     .fp32 = 67 * kTera, .tf32 = 494.5 * kTera, .bf16 = 989.5 * kTera, .fp8 = 1979 * kTera,
     .memory_bytes = 139.8 * kGiB, .hbm_bandwidth = 4.8e12, .nvlink_bandwidth = 450 * kGiga},
    {.id = "h800-pcie", .display_name = "H800 PCIe", .smi_name = "NVIDIA H800 PCIe",
     .match_words = "H800 PCIE", .fp32 = 51 * kTera, .tf32 = 378 * kTera, .bf16 = 756 * kTera,
     .fp8 = 1513 * kTera, .hbm_bandwidth = 2.0e12},
    {.id = "h800-sxm", .display_name = "H800 SXM", .smi_name = "NVIDIA H800", .match_words = "H800",
     .fp32 = 67 * kTera, .tf32 = 494.5 * kTera, .bf16 = 989.5 * kTera, .fp8 = 1979 * kTera,
     .hbm_bandwidth = 3.35e12, .nvlink_bandwidth = 200 * kGiga},
    {.id = "a100-pcie-40gb", .display_name = "A100 PCIe 40GB", .smi_name = "NVIDIA A100-PCIE-40GB",
     .match_words = "A100 PCIE 40GB", .fp32 = 19.5 * kTera, .tf32 = 156 * kTera,
     .bf16 = 312 * kTera, .hbm_bandwidth = 1.555e12},
    {.id = "a100-pcie-80gb", .display_name = "A100 PCIe 80GB", .smi_name = "NVIDIA A100 80GB PCIe",
     .match_words = "A100 PCIE", .fp32 = 19.5 * kTera, .tf32 = 156 * kTera, .bf16 = 312 * kTera,
     .hbm_bandwidth = 1.935e12},
    {.id = "a100-sxm4-40gb", .display_name = "A100 SXM4 40GB", .smi_name = "NVIDIA A100-SXM4-40GB",
     .match_words = "A100 40GB", .fp32 = 19.5 * kTera, .tf32 = 156 * kTera, .bf16 = 312 * kTera,
     .hbm_bandwidth = 1.555e12, .nvlink_bandwidth = 300 * kGiga},
    {.id = "a100-sxm4-80gb", .display_name = "A100 SXM4 80GB", .smi_name = "NVIDIA A100-SXM4-80GB",
     .match_words = "A100", .fp32 = 19.5 * kTera, .tf32 = 156 * kTera, .bf16 = 312 * kTera,
     .memory_bytes = 79.2 * kGiB, .hbm_bandwidth = 2.039e12, .nvlink_bandwidth = 300 * kGiga},
    {.id = "a800", .display_name = "A800", .smi_name = "NVIDIA A800-SXM4-80GB",
     .match_words = "A800", .fp32 = 19.5 * kTera, .tf32 = 156 * kTera, .bf16 = 312 * kTera},
    {.id = "gb200", .display_name = "GB200 (per Blackwell GPU)", .smi_name = "NVIDIA GB200",
     .match_words = "GB200", .fp32 = 80 * kTera, .tf32 = 1250 * kTera, .bf16 = 2500 * kTera,
     .fp8 = 5000 * kTera, .hbm_bandwidth = 8.0e12, .nvlink_bandwidth = 900 * kGiga},
    {.id = "b200", .display_name = "B200 (HGX)", .smi_name = "NVIDIA B200", .match_words = "B200",
     .fp32 = 75 * kTera, .tf32 = 1100 * kTera, .bf16 = 2250 * kTera, .fp8 = 4500 * kTera,
     .hbm_bandwidth = 7.7e12, .nvlink_bandwidth = 900 * kGiga},
    {.id = "l40s", .display_name = "L40S", .smi_name = "NVIDIA L40S", .match_words = "L40S",
     .fp32 = 91.6 * kTera, .tf32 = 183 * kTera, .bf16 = 362.05 * kTera, .fp8 = 733 * kTera,
     .hbm_bandwidth = 864 * kGiga},
    {.id = "l40", .display_name = "L40", .smi_name = "NVIDIA L40", .match_words = "L40",
     .fp32 = 90.5 * kTera, .tf32 = 90.5 * kTera, .bf16 = 181.05 * kTera, .fp8 = 362 * kTera,
     .hbm_bandwidth = 864 * kGiga},
    {.id = "l4", .display_name = "L4", .smi_name = "NVIDIA L4", .match_words = "L4",
     .fp32 = 30.3 * kTera, .tf32 = 60 * kTera, .bf16 = 121 * kTera, .fp8 = 242.5 * kTera,
     .hbm_bandwidth = 300 * kGiga},
    {.id = "a10", .display_name = "A10", .smi_name = "NVIDIA A10", .match_words = "A10",
     .fp32 = 31.2 * kTera, .tf32 = 62.5 * kTera, .bf16 = 125 * kTera, .hbm_bandwidth = 600 * kGiga},
};

// Upper-case words of a name, split on anything that is not a letter or a
// digit; the vendor prefixes carry no information.
std::vector<std::string> Words(std::string_view name) {
  std::vector<std::string> words;
  std::string word;
  auto flush = [&] {
    if (!word.empty() && word != "NVIDIA" && word != "TESLA") words.push_back(word);
    word.clear();
  };
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      word.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
    } else {
      flush();
    }
  }
  flush();
  return words;
}

bool HasAllWords(const std::vector<std::string>& words, std::string_view required) {
  for (const std::string& needed : Words(required)) {
    if (std::find(words.begin(), words.end(), needed) == words.end()) return false;
  }
  return true;
}

}  // namespace

std::string_view DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFp32: return "fp32";
    case Dtype::kTf32: return "tf32";
    case Dtype::kBf16: return "bf16";
    case Dtype::kFp8: return "fp8";
  }
  return "?";
}

std::optional<Dtype> ParseDtype(std::string_view name) {
  for (Dtype dtype : kAllDtypes) {
    if (DtypeName(dtype) == name) return dtype;
  }
  return std::nullopt;
}

double DeviceSpec::PeakFlops(Dtype dtype) const {
  switch (dtype) {
    case Dtype::kFp32: return fp32;
    case Dtype::kTf32: return tf32;
    case Dtype::kBf16: return bf16;
    case Dtype::kFp8: return fp8;
  }
  return 0;
}

std::span<const DeviceSpec> AllDevices() { return kDevices; }

const DeviceSpec* FindDevice(std::string_view smi_name) {
  const std::vector<std::string> words = Words(smi_name);
  if (words.empty()) return nullptr;
  for (const DeviceSpec& device : kDevices) {
    if (HasAllWords(words, device.match_words)) return &device;
  }
  return nullptr;
}

const DeviceSpec* DeviceById(std::string_view id) {
  for (const DeviceSpec& device : kDevices) {
    if (device.id == id) return &device;
  }
  return nullptr;
}

std::optional<double> DensePeakFlops(std::string_view smi_name, Dtype dtype) {
  const DeviceSpec* device = FindDevice(smi_name);
  if (device == nullptr) return std::nullopt;
  const double peak = device->PeakFlops(dtype);
  if (peak <= 0) return std::nullopt;
  return peak;
}

}  // namespace loom::hardware
