#include "coordinator/jobs/rank_peak.h"

#include <optional>

#include "common/hardware/device_peaks.h"

namespace loom::coordinator {

double RankPeakFlops(const NodeInfo& node, spec::Precision precision) {
  if (node.device_kind != "gpu") return node.peak_flops_per_device;
  hardware::Dtype dtype = hardware::Dtype::kFp32;
  if (precision == spec::Precision::kBf16) dtype = hardware::Dtype::kBf16;
  if (precision == spec::Precision::kFp8) dtype = hardware::Dtype::kFp8;
  const std::optional<double> peak = hardware::DensePeakFlops(node.device_name, dtype);
  return peak ? *peak : node.peak_flops_per_device;
}

}  // namespace loom::coordinator
