// What a step reports about its experts (the step report, Prometheus, the
// dashboard; docs/metrics.md). std-only: the progress printer includes it
// without the model. Filled by moe_stats.h.
#pragma once

#include <vector>

namespace loom::engine {

struct MoeSummary {
  // Routed assignments per expert this step (all DP ranks), summed over the
  // MoE layers: the expert-load panel's series.
  std::vector<double> tokens_per_expert;
  // Over every MoE layer and expert: the fewest and most assignments one
  // expert got in one layer, and the worst layer's max / mean.
  double tokens_min = 0;
  double tokens_max = 0;
  double imbalance = 0;
  double dropped_fraction = 0;  // assignments dropped by the capacity / all
  double aux_loss = 0;          // the objective's aux term: mean over micro-batches, summed over layers
};

}  // namespace loom::engine
