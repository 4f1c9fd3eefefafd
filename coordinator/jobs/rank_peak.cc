#include "coordinator/jobs/rank_peak.h"

#include <optional>

#include "common/hardware/device_peaks.h"
#include "common/spec/precision_recipe.h"

namespace loom::coordinator {

double RankPeakFlops(const NodeInfo& node, spec::Precision precision) {
  if (node.device_kind != "gpu") return node.peak_flops_per_device;
  const std::optional<double> peak =
      hardware::DensePeakFlops(node.device_name, spec::RecipeOf(precision).peak);
  return peak ? *peak : node.peak_flops_per_device;
}

}  // namespace loom::coordinator
