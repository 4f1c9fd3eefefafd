// [moe] The coordinator's expert-load metrics (docs/moe.md, docs/metrics.md),
// on the CoordinatorMetrics registry: per job, the imbalance, the dropped
// fraction, the aux loss, the fewest and most tokens of one expert, and
// loom_job_expert_tokens{expert} (the dashboard's expert-load panel, an
// IndexedJobSeries that CoordinatorMetrics serves). Not thread-safe on its own: CoordinatorMetrics calls it
// under its mutex.
#pragma once

#include <string>

#include "coordinator/service/indexed_job_series.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

class MoeMetrics {
 public:
  MoeMetrics(prometheus::Registry& registry, IndexedJobSeries& expert_tokens);
  void Set(const std::string& job_id, const std::string& job_name, const loom::v1::MoeProgress& m);
  void Remove(const std::string& job_id, const std::string& job_name);
  size_t SeriesCount();

 private:
  prometheus::Family<prometheus::Gauge>& imbalance_;
  prometheus::Family<prometheus::Gauge>& dropped_;
  prometheus::Family<prometheus::Gauge>& aux_loss_;
  prometheus::Family<prometheus::Gauge>& tokens_min_;
  prometheus::Family<prometheus::Gauge>& tokens_max_;
  IndexedJobSeries& expert_tokens_;
};

}  // namespace loom::coordinator
