#include "coordinator/jobs/job_metrics.h"

#include "coordinator/health/recovery_accounting.h"

namespace loom::coordinator {

void JobMetrics::JobsByState(const std::map<loom::v1::JobState, int>& counts) {
  if (metrics_ == nullptr) return;
  std::map<std::string, int> named;
  const google::protobuf::EnumDescriptor* states = loom::v1::JobState_descriptor();
  for (int i = 0; i < states->value_count(); ++i) {
    const auto state = static_cast<loom::v1::JobState>(states->value(i)->number());
    if (state == loom::v1::JOB_STATE_UNSPECIFIED) continue;
    auto it = counts.find(state);
    named[states->value(i)->name()] = it == counts.end() ? 0 : it->second;
  }
  metrics_->SetJobsByState(named);
}

void JobMetrics::RankStep(const loom::v1::Job& job, const loom::v1::RankProgress& progress,
                          double world, double rank_peak_flops) {
  if (metrics_ == nullptr) return;
  // A rank's share: its slice of the tokens against its own device's peak.
  const double tokens_per_second = progress.tokens_per_second() / world;
  metrics_->SetRankProgress(
      job.id(), job.name(), progress.rank(),
      {.step = static_cast<double>(progress.step()),
       .loss = progress.loss(),
       .step_seconds = progress.step_seconds(),
       .tokens_per_second = tokens_per_second,
       .mfu = rank_peak_flops > 0
                  ? progress.flops_per_token() * tokens_per_second / rank_peak_flops
                  : 0,
       .memory_bytes = static_cast<double>(progress.memory_bytes())});
}

void JobMetrics::RankStragglerScore(const loom::v1::Job& job, int32_t rank, double score) {
  if (metrics_ != nullptr) metrics_->SetRankStragglerScore(job.id(), job.name(), rank, score);
}

void JobMetrics::JobStep(const loom::v1::Job& job, const loom::v1::JobProgress& p,
                         const loom::v1::RankProgress& rank0) {
  if (metrics_ == nullptr) return;
  metrics_->SetJobProgress(job.id(), job.name(),
                           {.step = static_cast<double>(p.step()),
                            .loss = p.loss(),
                            .step_seconds = p.step_seconds(),
                            .tokens_per_second = p.tokens_per_second(),
                            .mfu = p.mfu()},
                           static_cast<double>(p.tokens()));
  if (p.has_val_loss()) metrics_->SetJobValLoss(job.id(), job.name(), p.val_loss());
  if (rank0.has_moe()) metrics_->SetJobMoe(job.id(), job.name(), rank0.moe());  // [moe]
}

void JobMetrics::Goodput(const loom::v1::Job& job) {
  if (metrics_ == nullptr || job.first_running_unix_ms() == 0) return;
  metrics_->SetJobGoodput(job.id(), job.name(), job.goodput());
}

void JobMetrics::Ranks(const loom::v1::Job& job, int64_t running, int64_t requested) {
  if (metrics_ != nullptr) metrics_->SetJobRanks(job.id(), job.name(), running, requested);
}

void JobMetrics::Restart(const loom::v1::Job& job) {
  if (metrics_ != nullptr) metrics_->CountRestart(job.id(), job.name());
}

void JobMetrics::Incident(const std::optional<loom::v1::RecoveryIncident>& incident) {
  if (!incident || metrics_ == nullptr) return;
  for (const auto& [phase, seconds] : MeasuredPhases(*incident)) {
    metrics_->ObserveRecoveryPhase(kRecoveryPhaseNames[phase], seconds);
  }
}

void JobMetrics::RemoveJob(const loom::v1::Job& job, int ranks) {
  if (metrics_ != nullptr) metrics_->RemoveJob(job.id(), job.name(), ranks);
}

}  // namespace loom::coordinator
