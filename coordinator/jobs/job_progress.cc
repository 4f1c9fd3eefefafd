// The lifecycle's progress side (job_lifecycle.h): the ranks' reports move
// their attempt (ready, RUNNING, resumed; in place, the survivors' "aborted"
// reports), rank 0's steps become the job's progress, its watchers' updates
// and its step series, and feed the hang detector and the recovery
// accounting.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/job_lifecycle.h"
#include "coordinator/jobs/job_states.h"
#include "coordinator/jobs/report_bounds.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

ProgressBatchResult JobLifecycle::OnRankProgressBatch(const std::string& node_id,
                                                      const loom::v1::RankProgressBatch& batch) {
  ProgressBatchResult result;
  absl::MutexLock lock(&table_->mu());
  if (!table_->ActingLocked()) return result;
  // A batch holds the reports of one node's ranks, mostly of one job: the
  // record found for one report serves the next ones of the same job.
  JobRecord* record = nullptr;
  for (const loom::v1::RankProgress& progress : batch.reports()) {
    if (record == nullptr || record->job.id() != progress.job_id()) {
      record = table_->FindLocked(progress.job_id());
    }
    // An earlier attempt's ranks may still be draining their last reports
    // after a restart: ignored, and not counted as refused.
    if (record != nullptr && progress.attempt() < record->job.attempt()) {
      ++result.stale;
      continue;
    }
    // Only the node that runs the rank in the current attempt speaks for it:
    // a report of another node's rank, a later attempt or an unknown job is
    // ignored, and counted.
    if (record == nullptr || progress.attempt() != record->job.attempt() ||
        progress.rank() < 0 || progress.rank() >= static_cast<int32_t>(record->ranks.size()) ||
        progress.rank() >= record->placement->size() ||
        record->placement->Get(progress.rank()).node_id() != node_id ||
        !CheckReportBounds(record->spec, static_cast<int64_t>(record->ranks.size()), progress).ok()) {
      if (result.refused++ == 0) {
        result.first_refused = absl::StrCat("job ", progress.job_id(), " attempt ",
                                            progress.attempt(), " rank ", progress.rank());
      }
      continue;
    }
    ++result.applied;
    ApplyProgressLocked(*record, progress);
  }
  return result;
}

void JobLifecycle::ApplyProgressLocked(JobRecord& record, const loom::v1::RankProgress& progress) {
  Job& job = record.job;
  if (!HoldsDevices(job.state())) return;
  RankState& rank = record.ranks[progress.rank()];
  // A rank re-sends its recent reports on a new stream (the old one may have
  // died with them unread); what this coordinator already saw is older than
  // what it holds and says nothing new.
  if (progress.time_unix_ms() < rank.last_time_unix_ms) return;
  rank.last_time_unix_ms = progress.time_unix_ms();
  rank.memory_bytes = progress.memory_bytes();
  if (progress.phase() == "aborted") {
    rank.aborted = progress;
  } else if (rank.aborted.has_value()) {
    rank.aborted.reset();
  }
  const absl::Time now = absl::Now();
  // A recovery's phases end at the ranks' own times: reports from different
  // ranks arrive in any order, and late when the machine is busy.
  const absl::Time sent =
      progress.time_unix_us() > 0 ? absl::FromUnixMicros(progress.time_unix_us()) : now;
  if (!rank.ready) {
    rank.ready = true;
    rank.ready_at = sent;
    ++record.ranks_ready;
  }
  if (record.hang) record.hang->Observe(progress, now);
  // In place: a survivor left its collectives and says what it holds.
  if (job.state() == JobState::RECOVERING && progress.phase() == "aborted") {
    OnAbortedLocked(record, progress);
  }
  // A start, or an attempt placed in place, joins when every rank is ready.
  const bool in_place = job.state() == JobState::RECOVERING && job.in_place_from_attempt() > 0;
  if ((job.state() == JobState::STARTING || in_place) &&
      record.ranks_ready == record.ranks.size()) {
    absl::Time all_ready = absl::InfinitePast();
    for (const RankState& r : record.ranks) all_ready = std::max(all_ready, r.ready_at);
    IncidentCompletedLocked(record, MarkReady(job, all_ready));
    GoodputTracker::Started(job, now);
    TransitionLocked(record, JobState::RUNNING,
                     absl::StrCat("all ", record.ranks.size(), " ranks joined attempt ",
                                  job.attempt(), in_place ? " in place" : ""));
    // Survivors of an in-place recovery may run on a node drained meanwhile.
    if (in_place) StopIfOnDrainedNodeLocked(record);
  }
  if (progress.phase() == "resumed" && !rank.resumed) {
    rank.resumed = true;
    rank.resumed_at = sent;
    if (++record.ranks_resumed == record.ranks.size()) {
      absl::Time all_resumed = absl::InfinitePast();
      for (const RankState& r : record.ranks) all_resumed = std::max(all_resumed, r.resumed_at);
      IncidentCompletedLocked(record, MarkResumed(job, all_resumed));
    }
  }
  // Only step reports move the job's progress; the others say where a rank is.
  if (progress.phase() != "step" || progress.step() <= 0) return;

  if (progress.has_timing() && ObserveTimingLocked(record, progress)) return;
  const double world = static_cast<double>(record.ranks.size());
  metrics_->RankStep(job, progress, world, record.placement->Get(progress.rank()).peak_flops());
  // Rank 0 speaks for the job: its loss is already averaged over DP. A new
  // attempt resumes from a checkpoint, so its steps start over from there.
  const bool new_attempt = job.last_progress().attempt() != job.attempt();
  if (progress.rank() != 0 || (!new_attempt && progress.step() <= job.last_progress().step())) {
    return;
  }
  const double peak = record.peak_flops;  // summed once at placement
  loom::v1::JobProgress& p = *job.mutable_last_progress();
  p.set_step(progress.step());
  p.set_total_steps(record.spec.train.steps);
  p.set_loss(progress.loss());
  p.set_has_val_loss(progress.has_val_loss());
  p.set_val_loss(progress.has_val_loss() ? progress.val_loss() : 0);
  p.set_tokens(progress.tokens());
  p.set_step_seconds(progress.step_seconds());
  p.set_tokens_per_second(progress.tokens_per_second());
  p.set_mfu(peak > 0 ? progress.flops_per_token() * progress.tokens_per_second() / peak : 0);
  p.set_attempt(job.attempt());
  p.set_lr(progress.lr());
  p.set_grad_norm(progress.grad_norm());
  p.set_skipped_steps(progress.skipped_steps());
  if (!progress.bad_step().empty()) {
    p.set_last_bad_step(absl::StrCat("step ", progress.step(), ": ", progress.bad_step()));
  }
  int64_t max_memory = 0;
  for (const RankState& r : record.ranks) max_memory = std::max(max_memory, r.memory_bytes);
  p.set_max_memory_bytes(max_memory);
  p.set_eta_seconds(static_cast<double>(record.spec.train.steps - progress.step()) *
                    progress.step_seconds());
  p.set_time_unix_ms(progress.time_unix_ms());
  hub_->AddStep(job.id(), p);
  // Recovery ends with the new attempt's first step; goodput counts it.
  if (new_attempt) IncidentCompletedLocked(record, MarkFirstStep(job, sent, progress.step() - 1));
  record.goodput.OnStep(job, progress.step(), progress.step_seconds());
  GoodputTracker::Update(job, now);
  metrics_->JobStep(job, p, progress);
  metrics_->Goodput(job);
  loom::v1::WatchJobResponse update;
  *update.mutable_job() = WatchHub::WatchView(job);
  *update.mutable_progress() = p;
  NotifyLocked(record, std::move(update));
  // Progress and steps are soft state; storing them at most once a second
  // keeps the store off the step path.
  if (now - record.last_persist > absl::Seconds(1)) table_->PersistLocked(record, Durability::kSoft);
}

}  // namespace loom::coordinator
