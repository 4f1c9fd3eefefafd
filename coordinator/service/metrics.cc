#include "coordinator/service/metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "coordinator/health/recovery_accounting.h"

namespace loom::coordinator {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry& r, const char* name,
                                             const char* help) {
  return BuildGauge().Name(name).Help(help).Register(r);
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      jobs_(Gauge(*registry_, "loom_jobs", "Jobs by state")),
      nodes_live_(Gauge(*registry_, "loom_nodes_live", "Nodes with a live agent session")),
      nodes_cordoned_(Gauge(*registry_, "loom_nodes_cordoned",
                            "Known nodes cordoned (used for new ranks only when nothing else fits)")),
      devices_live_(Gauge(*registry_, "loom_devices_live", "Devices on live nodes, by kind")),
      rpcs_(BuildCounter()
                .Name("loom_rpcs_total")
                .Help("RPCs handled, by method and status code")
                .Register(*registry_)),
      progress_refused_(BuildCounter()
                            .Name("loom_node_progress_refused_total")
                            .Help("Progress reports a node sent for ranks it does not run in "
                                  "their jobs' current attempts (ignored)")
                            .Register(*registry_)
                            .Add({})),
      rank_step_(Gauge(*registry_, "loom_rank_step", "Last step a rank completed")),
      rank_loss_(Gauge(*registry_, "loom_rank_loss", "Training loss a rank reported")),
      rank_step_seconds_(Gauge(*registry_, "loom_rank_step_seconds", "A rank's last step time")),
      rank_tokens_per_second_(
          Gauge(*registry_, "loom_rank_tokens_per_second", "Tokens per second seen by a rank")),
      rank_mfu_(Gauge(*registry_, "loom_rank_mfu", "Model FLOPs utilisation of a rank (0-1)")),
      rank_memory_bytes_(Gauge(*registry_, "loom_rank_memory_bytes",
                               "Peak memory of a rank's last step: device allocator on a GPU, "
                               "resident set on a CPU")),
      rank_straggler_score_(Gauge(*registry_, "loom_rank_straggler_score",
                                  "A rank's robust score (median/MAD z) of its compute time "
                                  "against its peers'; over 3, sustained: a straggler")),
      job_step_(Gauge(*registry_, "loom_job_step", "Last completed step of a job")),
      job_loss_(Gauge(*registry_, "loom_job_loss", "Training loss of a job (DP-averaged)")),
      job_val_loss_(Gauge(*registry_, "loom_job_val_loss", "Validation loss of a job")),
      job_step_seconds_(Gauge(*registry_, "loom_job_step_seconds", "Step time of a job")),
      job_tokens_per_second_(
          Gauge(*registry_, "loom_job_tokens_per_second", "Tokens per second of a job")),
      job_mfu_(Gauge(*registry_, "loom_job_mfu", "Model FLOPs utilisation of a job (0-1)")),
      job_tokens_(Gauge(*registry_, "loom_job_tokens", "Tokens a job has trained on")),
      job_restarts_(BuildCounter()
                        .Name("loom_job_restarts_total")
                        .Help("Restarts of a job")
                        .Register(*registry_)),
      job_goodput_(Gauge(*registry_, "loom_job_goodput",
                         "Fraction of a job's wall time since it first ran spent in steps that "
                         "counted (0-1)")),
      recovery_phase_seconds_(prometheus::BuildHistogram()
                                  .Name("loom_recovery_phase_seconds")
                                  .Help("Duration of each phase of the recoveries from failures")
                                  .Register(*registry_)) {
  // Fixed buckets from a fast local restart to a slow placement; every phase
  // exists from the start, so dashboards and alerts see zeros, not nothing.
  const prometheus::Histogram::BucketBoundaries buckets = {0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                                           5,    10,  30,   60,  120, 300};
  for (const char* phase : kRecoveryPhaseNames) {
    recovery_phases_[phase] = &recovery_phase_seconds_.Add({{"phase", phase}}, buckets);
  }
}

absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> CoordinatorMetrics::Create(
    const std::string& listen) {
  std::unique_ptr<CoordinatorMetrics> metrics(new CoordinatorMetrics());
  if (!listen.empty()) {
    try {
      metrics->exposer_ = std::make_unique<prometheus::Exposer>(listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("--metrics_listen=", listen, ": cannot serve metrics: ", e.what()));
    }
    metrics->exposer_->RegisterCollectable(metrics->registry_);
    const auto ports = metrics->exposer_->GetListeningPorts();
    if (!ports.empty()) metrics->port_ = ports.front();
  }
  return metrics;
}

void CoordinatorMetrics::SetJobsByState(const std::map<std::string, int>& counts) {
  absl::MutexLock lock(&mu_);
  for (const auto& [state, count] : counts) jobs_.Add({{"state", state}}).Set(count);
}

void CoordinatorMetrics::SetNodes(int live_nodes, int cordoned_nodes,
                                  const std::map<std::string, int>& devices) {
  absl::MutexLock lock(&mu_);
  nodes_live_.Add({}).Set(live_nodes);
  nodes_cordoned_.Add({}).Set(cordoned_nodes);
  for (const auto& kind : {"cpu", "gpu"}) {
    auto it = devices.find(kind);
    devices_live_.Add({{"kind", kind}}).Set(it == devices.end() ? 0 : it->second);
  }
}

void CoordinatorMetrics::CountRpc(const std::string& method, const std::string& code) {
  absl::MutexLock lock(&mu_);
  rpcs_.Add({{"method", method}, {"code", code}}).Increment();
}

void CoordinatorMetrics::CountProgressRefused(int64_t reports) {
  progress_refused_.Increment(static_cast<double>(reports));  // atomic: no lock
}

void CoordinatorMetrics::SetRankProgress(const std::string& job_id, const std::string& job_name,
                                         int rank, const ProgressSample& s) {
  if (rank < 0) return;
  absl::MutexLock lock(&mu_);
  std::vector<RankSeries>& ranks = rank_series_[job_id];
  if (ranks.size() <= static_cast<size_t>(rank)) ranks.resize(rank + 1, RankSeries{});
  RankSeries& series = ranks[rank];
  if (series.step == nullptr) {
    const prometheus::Labels labels = {
        {"job", job_id}, {"job_name", job_name}, {"rank", std::to_string(rank)}};
    series = {&rank_step_.Add(labels),  &rank_loss_.Add(labels),
              &rank_step_seconds_.Add(labels), &rank_tokens_per_second_.Add(labels),
              &rank_mfu_.Add(labels),   &rank_memory_bytes_.Add(labels)};
  }
  series.step->Set(s.step);
  series.loss->Set(s.loss);
  series.step_seconds->Set(s.step_seconds);
  series.tokens_per_second->Set(s.tokens_per_second);
  series.mfu->Set(s.mfu);
  series.memory_bytes->Set(s.memory_bytes);
}

void CoordinatorMetrics::SetRankStragglerScore(const std::string& job_id,
                                               const std::string& job_name, int rank, double score) {
  if (rank < 0) return;
  absl::MutexLock lock(&mu_);
  rank_straggler_score_.Add({{"job", job_id}, {"job_name", job_name}, {"rank", std::to_string(rank)}})
      .Set(score);
}

void CoordinatorMetrics::SetJobProgress(const std::string& job_id, const std::string& job_name,
                                        const ProgressSample& s, double tokens) {
  absl::MutexLock lock(&mu_);
  const prometheus::Labels labels = {{"job", job_id}, {"job_name", job_name}};
  job_step_.Add(labels).Set(s.step);
  job_loss_.Add(labels).Set(s.loss);
  job_step_seconds_.Add(labels).Set(s.step_seconds);
  job_tokens_per_second_.Add(labels).Set(s.tokens_per_second);
  job_mfu_.Add(labels).Set(s.mfu);
  job_tokens_.Add(labels).Set(tokens);
}

void CoordinatorMetrics::SetJobValLoss(const std::string& job_id, const std::string& job_name,
                                       double val_loss) {
  absl::MutexLock lock(&mu_);
  job_val_loss_.Add({{"job", job_id}, {"job_name", job_name}}).Set(val_loss);
}

void CoordinatorMetrics::SetJobMoe(const std::string& job_id, const std::string& job_name,
                                   const loom::v1::MoeProgress& moe) {
  absl::MutexLock lock(&mu_);
  if (moe_ == nullptr) moe_ = std::make_unique<MoeMetrics>(*registry_);
  moe_->Set(job_id, job_name, moe);
}

void CoordinatorMetrics::CountRestart(const std::string& job_id, const std::string& job_name) {
  absl::MutexLock lock(&mu_);
  job_restarts_.Add({{"job", job_id}, {"job_name", job_name}}).Increment();
}

void CoordinatorMetrics::ObserveRecoveryPhase(const std::string& phase, double seconds) {
  absl::MutexLock lock(&mu_);
  auto it = recovery_phases_.find(phase);
  if (it != recovery_phases_.end()) it->second->Observe(seconds);
}

void CoordinatorMetrics::SetJobGoodput(const std::string& job_id, const std::string& job_name,
                                       double goodput) {
  absl::MutexLock lock(&mu_);
  job_goodput_.Add({{"job", job_id}, {"job_name", job_name}}).Set(goodput);
}

namespace {

template <typename T>
void RemoveSeries(prometheus::Family<T>& family, const prometheus::Labels& labels) {
  if (family.Has(labels)) family.Remove(&family.Add(labels));
}

}  // namespace

void CoordinatorMetrics::RemoveJob(const std::string& job_id, const std::string& job_name,
                                   int ranks) {
  absl::MutexLock lock(&mu_);
  const prometheus::Labels job = {{"job", job_id}, {"job_name", job_name}};
  for (auto* family : {&job_step_, &job_loss_, &job_val_loss_, &job_step_seconds_,
                       &job_tokens_per_second_, &job_mfu_, &job_tokens_, &job_goodput_}) {
    RemoveSeries(*family, job);
  }
  RemoveSeries(job_restarts_, job);
  if (moe_ != nullptr) moe_->Remove(job_id, job_name);  // [moe]
  rank_series_.erase(job_id);
  for (int rank = 0; rank < ranks; ++rank) {
    const prometheus::Labels labels = {
        {"job", job_id}, {"job_name", job_name}, {"rank", std::to_string(rank)}};
    for (auto* family : {&rank_step_, &rank_loss_, &rank_step_seconds_, &rank_tokens_per_second_,
                         &rank_mfu_, &rank_memory_bytes_, &rank_straggler_score_}) {
      RemoveSeries(*family, labels);
    }
  }
}

size_t CoordinatorMetrics::JobSeriesCount() {
  absl::MutexLock lock(&mu_);
  size_t count = 0;
  for (auto* family : {&job_step_, &job_loss_, &job_val_loss_, &job_step_seconds_,
                       &job_tokens_per_second_, &job_mfu_, &job_tokens_, &job_goodput_,
                       &rank_step_, &rank_loss_,
                       &rank_step_seconds_, &rank_tokens_per_second_, &rank_mfu_,
                       &rank_memory_bytes_, &rank_straggler_score_}) {
    for (const auto& metric : family->Collect()) count += metric.metric.size();
  }
  for (const auto& metric : job_restarts_.Collect()) count += metric.metric.size();
  if (moe_ != nullptr) count += moe_->SeriesCount();  // [moe]
  return count;
}

}  // namespace loom::coordinator
