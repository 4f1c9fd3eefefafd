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
      beats_(BuildCounter()
                 .Name("loom_node_beats_total")
                 .Help("Datagrams on the liveness path: result=heard (an agent's beat, "
                       "acked) or refused (forged, replayed, of no counting session)")
                 .Register(*registry_)),
      beats_heard_(beats_.Add({{"result", "heard"}})),
      beats_refused_(beats_.Add({{"result", "refused"}})),
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
      job_ranks_(Gauge(*registry_, "loom_job_ranks", "Ranks the job's current attempt runs")),
      job_requested_ranks_(Gauge(*registry_, "loom_job_requested_ranks",
                                 "Ranks the job asked for (above loom_job_ranks while an elastic "
                                 "job runs shrunk)")),
      recovery_phase_seconds_(prometheus::BuildHistogram()
                                  .Name("loom_recovery_phase_seconds")
                                  .Help("Duration of each phase of the recoveries from failures")
                                  .Register(*registry_)),
      rank_series_(std::make_shared<IndexedJobSeries>(
          "rank",
          std::vector<IndexedJobSeries::Gauge>{
              {"loom_rank_step", "Last step a rank completed"},
              {"loom_rank_loss", "Training loss a rank reported"},
              {"loom_rank_step_seconds", "A rank's last step time"},
              {"loom_rank_tokens_per_second", "Tokens per second seen by a rank"},
              {"loom_rank_mfu", "Model FLOPs utilisation of a rank (0-1)"},
              {"loom_rank_memory_bytes",
               "Peak memory of a rank's last step: device allocator on a GPU, resident set on a "
               "CPU"}})),
      rank_straggler_score_(std::make_shared<IndexedJobSeries>(
          "rank", std::vector<IndexedJobSeries::Gauge>{
                      {"loom_rank_straggler_score",
                       "A rank's robust score (median/MAD z) of its compute time against its "
                       "peers'; over 3, sustained: a straggler"}})),
      expert_tokens_(std::make_shared<IndexedJobSeries>(
          "expert", std::vector<IndexedJobSeries::Gauge>{
                        {"loom_job_expert_tokens",
                         "Tokens routed to an expert in the last step, summed over MoE layers"}})) {
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
    metrics->exposer_->RegisterCollectable(metrics->rank_series_);
    metrics->exposer_->RegisterCollectable(metrics->rank_straggler_score_);
    metrics->exposer_->RegisterCollectable(metrics->expert_tokens_);
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

void CoordinatorMetrics::SetLivenessBeats(int64_t heard, int64_t refused) {
  // Totals kept by the board; each counter is raised to its total (one caller).
  auto raise_to = [](prometheus::Counter& counter, int64_t total) {
    const double delta = static_cast<double>(total) - counter.Value();
    if (delta > 0) counter.Increment(delta);
  };
  raise_to(beats_heard_, heard);
  raise_to(beats_refused_, refused);
}

void CoordinatorMetrics::SetRankProgress(const std::string& job_id, const std::string& job_name,
                                         int rank, const ProgressSample& s) {
  if (rank < 0) return;
  const double row[] = {s.step, s.loss, s.step_seconds, s.tokens_per_second, s.mfu,
                        s.memory_bytes};
  rank_series_->SetRow(job_id, job_name, static_cast<size_t>(rank), row);  // its own lock
}

void CoordinatorMetrics::SetRankStragglerScore(const std::string& job_id,
                                               const std::string& job_name, int rank, double score) {
  if (rank < 0) return;
  const double row[] = {score};
  rank_straggler_score_->SetRow(job_id, job_name, static_cast<size_t>(rank), row);
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
  if (moe_ == nullptr) moe_ = std::make_unique<MoeMetrics>(*registry_, *expert_tokens_);
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

void CoordinatorMetrics::SetJobRanks(const std::string& job_id, const std::string& job_name,
                                     int64_t running, int64_t requested) {
  absl::MutexLock lock(&mu_);
  const prometheus::Labels labels = {{"job", job_id}, {"job_name", job_name}};
  job_ranks_.Add(labels).Set(static_cast<double>(running));
  job_requested_ranks_.Add(labels).Set(static_cast<double>(requested));
}

namespace {

template <typename T>
void RemoveSeries(prometheus::Family<T>& family, const prometheus::Labels& labels) {
  if (family.Has(labels)) family.Remove(&family.Add(labels));
}

}  // namespace

void CoordinatorMetrics::RemoveJob(const std::string& job_id, const std::string& job_name,
                                   int /*ranks: every row of the job goes*/) {
  absl::MutexLock lock(&mu_);
  const prometheus::Labels job = {{"job", job_id}, {"job_name", job_name}};
  for (auto* family : {&job_step_, &job_loss_, &job_val_loss_, &job_step_seconds_,
                       &job_tokens_per_second_, &job_mfu_, &job_tokens_, &job_goodput_,
                       &job_ranks_, &job_requested_ranks_}) {
    RemoveSeries(*family, job);
  }
  RemoveSeries(job_restarts_, job);
  if (moe_ != nullptr) moe_->Remove(job_id, job_name);  // [moe]
  rank_series_->RemoveJob(job_id);
  rank_straggler_score_->RemoveJob(job_id);
}

size_t CoordinatorMetrics::JobSeriesCount() {
  absl::MutexLock lock(&mu_);
  size_t count = 0;
  for (auto* family : {&job_step_, &job_loss_, &job_val_loss_, &job_step_seconds_,
                       &job_tokens_per_second_, &job_mfu_, &job_tokens_, &job_goodput_,
                       &job_ranks_, &job_requested_ranks_}) {
    for (const auto& metric : family->Collect()) count += metric.metric.size();
  }
  for (const auto& metric : job_restarts_.Collect()) count += metric.metric.size();
  count += rank_series_->SeriesCount();
  count += rank_straggler_score_->SeriesCount();
  if (moe_ != nullptr) count += moe_->SeriesCount();  // [moe]
  return count;
}

}  // namespace loom::coordinator
