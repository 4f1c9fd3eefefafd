// loom-device-peaks: the peak table (device_peaks.h) on the command line, so
// scripts (scripts/device/gpu_train_check.sh: MFU of loom-trainer and of the
// PyTorch baseline) read the same numbers as the agent and the planner.
//   loom-device-peaks                  the whole table, tab-separated
//   loom-device-peaks NAME             the row NAME (as nvidia-smi prints it) denotes
//   loom-device-peaks NAME DTYPE       that row's dense peak in FLOP/s (fp32|tf32|bf16|fp8)
// Exit 0 with an answer; 1 when NAME is not in the table; 2 when the device
// has no units for DTYPE (prints "none"); 64 on a usage error.
#include <cstdio>
#include <optional>
#include <string>

#include "common/hardware/device_peaks.h"

namespace {

using loom::hardware::DeviceSpec;
using loom::hardware::Dtype;

void PrintRow(const DeviceSpec& d) {
  std::printf("%s\t%s\t%s", std::string(d.id).c_str(), std::string(d.display_name).c_str(),
              std::string(d.smi_name).c_str());
  for (Dtype dtype : loom::hardware::kAllDtypes) std::printf("\t%.6g", d.PeakFlops(dtype));
  std::printf("\t%.6g\t%.6g\t%.6g\n", d.memory_bytes, d.hbm_bandwidth, d.nvlink_bandwidth);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 1) {
    std::printf("id\tname\tnvidia_smi_name\tfp32\ttf32\tbf16\tfp8\tmemory_bytes\thbm_bytes_per_s"
                "\tnvlink_bytes_per_s\n");
    for (const DeviceSpec& d : loom::hardware::AllDevices()) PrintRow(d);
    return 0;
  }
  if (argc > 3 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: loom-device-peaks [NAME [fp32|tf32|bf16|fp8]]\n");
    return argc > 3 ? 64 : 0;
  }
  const DeviceSpec* device = loom::hardware::FindDevice(argv[1]);
  if (device == nullptr) {
    std::fprintf(stderr, "loom-device-peaks: '%s' is not in the peak table "
                 "(common/hardware/device_peaks.cc)\n", argv[1]);
    return 1;
  }
  if (argc == 2) {
    PrintRow(*device);
    return 0;
  }
  const std::optional<Dtype> dtype = loom::hardware::ParseDtype(argv[2]);
  if (!dtype) {
    std::fprintf(stderr, "loom-device-peaks: dtype '%s' must be fp32, tf32, bf16 or fp8\n",
                 argv[2]);
    return 64;
  }
  const double peak = device->PeakFlops(*dtype);
  if (peak <= 0) {
    std::printf("none\n");
    return 2;
  }
  std::printf("%.6g\n", peak);
  return 0;
}
