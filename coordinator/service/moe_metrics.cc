#include "coordinator/service/moe_metrics.h"

#include <span>

namespace loom::coordinator {
namespace {

prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry& r, const char* name,
                                             const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

template <typename T>
void RemoveSeries(prometheus::Family<T>& family, const prometheus::Labels& labels) {
  if (family.Has(labels)) family.Remove(&family.Add(labels));
}

}  // namespace

MoeMetrics::MoeMetrics(prometheus::Registry& r, IndexedJobSeries& expert_tokens)
    : imbalance_(Gauge(r, "loom_job_moe_imbalance",
                       "Expert-load imbalance of a job's last step: the worst MoE layer's max / "
                       "mean tokens per expert (1 = balanced)")),
      dropped_(Gauge(r, "loom_job_moe_dropped_fraction",
                     "Fraction of routed tokens the capacity factor dropped in the last step")),
      aux_loss_(Gauge(r, "loom_job_moe_aux_loss", "Load-balancing aux loss of the last step")),
      tokens_min_(Gauge(r, "loom_job_moe_tokens_min",
                        "Fewest tokens one expert got in one MoE layer in the last step")),
      tokens_max_(Gauge(r, "loom_job_moe_tokens_max",
                        "Most tokens one expert got in one MoE layer in the last step")),
      expert_tokens_(expert_tokens) {}

void MoeMetrics::Set(const std::string& job_id, const std::string& job_name,
                     const loom::v1::MoeProgress& m) {
  const prometheus::Labels labels = {{"job", job_id}, {"job_name", job_name}};
  imbalance_.Add(labels).Set(m.imbalance());
  dropped_.Add(labels).Set(m.dropped_fraction());
  aux_loss_.Add(labels).Set(m.aux_loss());
  tokens_min_.Add(labels).Set(m.tokens_min());
  tokens_max_.Add(labels).Set(m.tokens_max());
  expert_tokens_.SetColumn(job_id, job_name,
                           std::span<const double>(m.tokens_per_expert().data(),
                                                   m.tokens_per_expert().size()));
}

void MoeMetrics::Remove(const std::string& job_id, const std::string& job_name) {
  const prometheus::Labels labels = {{"job", job_id}, {"job_name", job_name}};
  for (auto* family : {&imbalance_, &dropped_, &aux_loss_, &tokens_min_, &tokens_max_}) {
    RemoveSeries(*family, labels);
  }
  expert_tokens_.RemoveJob(job_id);
}

size_t MoeMetrics::SeriesCount() {
  size_t count = 0;
  for (auto* family : {&imbalance_, &dropped_, &aux_loss_, &tokens_min_, &tokens_max_}) {
    for (const auto& metric : family->Collect()) count += metric.metric.size();
  }
  return count + expert_tokens_.SeriesCount();
}

}  // namespace loom::coordinator
