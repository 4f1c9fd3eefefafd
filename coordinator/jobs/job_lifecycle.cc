// The life of a placed job: progress aggregation, rank exits, lost and
// revived nodes, restarts within the budget. Placement and launch are in
// job_scheduler.cc, admission in job_admission.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "common/spec/job_spec_yaml.h"
#include "coordinator/jobs/assignment_builder.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_states.h"
#include "coordinator/service/metrics.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;

namespace {

std::string DescribeExit(const loom::v1::RankExited& exit) {
  if (exit.signal() != 0) return absl::StrCat("was killed by signal ", exit.signal());
  if (exit.exit_code() == kExitJobBroken) {
    return absl::StrCat("exited with code ", exit.exit_code(), " (the job cannot run as specified)");
  }
  if (exit.exit_code() == kExitCollectiveTimeout) {
    return absl::StrCat("exited with code ", exit.exit_code(), " (a collective timed out)");
  }
  return absl::StrCat("exited with code ", exit.exit_code());
}

}  // namespace

ProgressBatchResult JobManager::OnRankProgressBatch(const std::string& node_id,
                                                    const loom::v1::RankProgressBatch& batch) {
  ProgressBatchResult result;
  absl::MutexLock lock(&mu_);
  // A batch holds the reports of one node's ranks, mostly of one job: the
  // record found for one report serves the next ones of the same job.
  JobRecord* record = nullptr;
  for (const loom::v1::RankProgress& progress : batch.reports()) {
    if (record == nullptr || record->job.id() != progress.job_id()) {
      auto it = jobs_.find(progress.job_id());
      record = it == jobs_.end() ? nullptr : &it->second;
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
        record->placement->Get(progress.rank()).node_id() != node_id) {
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

void JobManager::ApplyProgressLocked(JobRecord& record, const loom::v1::RankProgress& progress) {
  Job& job = record.job;
  if (!HoldsDevices(job.state())) return;
  RankState& rank = record.ranks[progress.rank()];
  // A rank re-sends its recent reports on a new stream (the old one may have
  // died with them unread); what this coordinator already saw is older than
  // what it holds and says nothing new.
  if (progress.time_unix_ms() < rank.last.time_unix_ms()) return;
  rank.last = progress;
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
  if (job.state() == JobState::STARTING && record.ranks_ready == record.ranks.size()) {
    absl::Time all_ready = absl::InfinitePast();
    for (const RankState& r : record.ranks) all_ready = std::max(all_ready, r.ready_at);
    IncidentCompletedLocked(record, MarkReady(job, all_ready));
    GoodputTracker::Started(job, now);
    TransitionLocked(record, JobState::RUNNING,
                     absl::StrCat("all ", record.ranks.size(), " ranks joined attempt ",
                                  job.attempt()));
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

  const double world = static_cast<double>(record.ranks.size());
  const double peak = record.peak_flops;  // summed once at placement
  const double mfu =
      peak > 0 ? progress.flops_per_token() * progress.tokens_per_second() / peak : 0;
  if (metrics_ != nullptr) {
    // A rank's share: its slice of the tokens against its own device's peak.
    const double rank_tokens_per_second = progress.tokens_per_second() / world;
    const double rank_peak = record.placement->Get(progress.rank()).peak_flops();
    metrics_->SetRankProgress(
        job.id(), job.name(), progress.rank(),
        {.step = static_cast<double>(progress.step()),
         .loss = progress.loss(),
         .step_seconds = progress.step_seconds(),
         .tokens_per_second = rank_tokens_per_second,
         .mfu = rank_peak > 0 ? progress.flops_per_token() * rank_tokens_per_second / rank_peak
                              : 0,
         .memory_bytes = static_cast<double>(progress.memory_bytes())});
  }
  // Rank 0 speaks for the job: its loss is already averaged over DP. A new
  // attempt resumes from a checkpoint, so its steps start over from there.
  const bool new_attempt = job.last_progress().attempt() != job.attempt();
  if (progress.rank() != 0 || (!new_attempt && progress.step() <= job.last_progress().step())) {
    return;
  }
  loom::v1::JobProgress& p = *job.mutable_last_progress();
  p.set_step(progress.step());
  p.set_total_steps(record.spec.train.steps);
  p.set_loss(progress.loss());
  p.set_has_val_loss(progress.has_val_loss());
  p.set_val_loss(progress.has_val_loss() ? progress.val_loss() : 0);
  p.set_tokens(progress.tokens());
  p.set_step_seconds(progress.step_seconds());
  p.set_tokens_per_second(progress.tokens_per_second());
  p.set_mfu(mfu);
  p.set_attempt(job.attempt());
  p.set_lr(progress.lr());
  p.set_grad_norm(progress.grad_norm());
  int64_t max_memory = 0;
  for (const RankState& r : record.ranks) max_memory = std::max(max_memory, r.last.memory_bytes());
  p.set_max_memory_bytes(max_memory);
  p.set_eta_seconds(static_cast<double>(record.spec.train.steps - progress.step()) *
                    progress.step_seconds());
  p.set_time_unix_ms(progress.time_unix_ms());
  record.steps.push_back(p);
  if (record.steps.size() > kWatchBacklogSteps) record.steps.pop_front();
  // Recovery ends with the new attempt's first step; goodput counts it.
  if (new_attempt) IncidentCompletedLocked(record, MarkFirstStep(job, sent, progress.step() - 1));
  record.goodput.OnStep(job, progress.step(), progress.step_seconds());
  const double goodput = GoodputTracker::Update(job, now);
  if (metrics_ != nullptr) {
    metrics_->SetJobProgress(job.id(), job.name(),
                             {.step = static_cast<double>(p.step()),
                              .loss = p.loss(),
                              .step_seconds = p.step_seconds(),
                              .tokens_per_second = p.tokens_per_second(),
                              .mfu = mfu},
                             static_cast<double>(p.tokens()));
    if (p.has_val_loss()) metrics_->SetJobValLoss(job.id(), job.name(), p.val_loss());
    if (progress.has_moe()) metrics_->SetJobMoe(job.id(), job.name(), progress.moe());  // [moe]
    metrics_->SetJobGoodput(job.id(), job.name(), goodput);
  }
  loom::v1::WatchJobResponse update;
  *update.mutable_job() = WatchView(job);
  *update.mutable_progress() = p;
  NotifyLocked(record, update);
  // Progress is soft state; persisting it at most once a second keeps the
  // database off the step path.
  if (now - record.last_persist > absl::Seconds(1)) PersistLocked(record);
}

void JobManager::OnRankExited(const std::string& node_id, const loom::v1::RankExited& exit) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(exit.job_id());
  if (it == jobs_.end()) return;
  JobRecord& record = it->second;
  Job& job = record.job;
  if (exit.attempt() != job.attempt() || exit.rank() < 0 ||
      exit.rank() >= static_cast<int32_t>(record.ranks.size())) {
    return;
  }
  // Only the node that runs the rank speaks for it (a session cannot end
  // another node's ranks, or another job's).
  if (exit.rank() >= record.placement->size() ||
      record.placement->Get(exit.rank()).node_id() != node_id) {
    std::fprintf(stderr, "job %s: ignored an exit of rank %d from node %s, which does not run it\n",
                 job.id().c_str(), exit.rank(), node_id.c_str());
    return;
  }
  RankState& rank = record.ranks[exit.rank()];
  if (rank.exited) return;
  rank.exited = true;
  const bool all_exited = ++record.ranks_exited == record.ranks.size();
  const JobState state = job.state();
  if (state == JobState::RESTARTING) {
    if (all_exited) {
      FinishAttemptLocked(record);
      ScheduleLocked();
    }
    return;
  }
  if (!HoldsDevices(state)) return;
  if (exit.signal() == 0 && exit.exit_code() == kExitOk) {
    if (all_exited) {
      TransitionLocked(record, JobState::SUCCEEDED,
                       absl::StrCat("all ranks finished ", record.spec.train.steps, " steps"));
      FinishAttemptLocked(record);
      ScheduleLocked();
    }
    return;
  }
  const std::string& place = record.placement->Get(exit.rank()).place();
  std::string reason = absl::StrCat("rank ", exit.rank(), " ", place, " on node ", node_id, " ",
                                    DescribeExit(exit));
  if (!exit.log_tail().empty()) absl::StrAppend(&reason, "; its log ends:\n", exit.log_tail());
  const FailureKind kind = exit.signal() == 0 && exit.exit_code() == kExitJobBroken
                               ? FailureKind::kJobBroken
                               : FailureKind::kCrash;
  // The agent says when it saw the exit; an agent that does not, or an exit
  // found missing at a heartbeat, starts the incident now.
  const absl::Time cause =
      exit.exited_unix_us() > 0 ? absl::FromUnixMicros(exit.exited_unix_us()) : absl::Now();
  HandleFailureLocked(record, kind, reason, node_id, exit.rank(), cause);
}

void JobManager::OnNodeLost(const std::string& node_id, const std::string& why) {
  // The node's failure began at its last heartbeat (for a session that
  // ended, that is about when it ended).
  std::optional<NodeInfo> info = nodes_->Get(node_id);
  const absl::Time cause = info && info->last_seen != absl::Time() ? info->last_seen : absl::Now();
  absl::MutexLock lock(&mu_);
  for (const std::string& id : order_) {
    JobRecord& record = jobs_.at(id);
    if (!HoldsDevices(record.job.state())) continue;
    bool affected = false;
    for (const auto& p : *record.placement) {
      RankState& rank = record.ranks[p.rank()];
      if (p.node_id() == node_id && !rank.exited) {
        rank.exited = true;
        ++record.ranks_exited;
        affected = true;
      }
    }
    if (!affected) continue;
    if (record.job.state() == JobState::RESTARTING) {
      if (record.ranks_exited == record.ranks.size()) {
        FinishAttemptLocked(record);
      }
      continue;
    }
    HandleFailureLocked(record, FailureKind::kNodeLost,
                        absl::StrCat("node ", node_id, " was lost (", why, ")"),
                        node_id, /*rank=*/-1, cause);
  }
  ScheduleLocked();
}

void JobManager::OnNodeRegistered(const loom::v1::RegisterNode& registration) {
  {
    absl::MutexLock lock(&mu_);
    // Ranks this node ran may have ended while no one was listening (a
    // coordinator restart). The agent re-sends those exits right after it
    // registers, so the check waits for its first heartbeat, which follows
    // them on the same stream.
    unconfirmed_[registration.node_id()] = absl::Now();
  }
  Schedule();
}

void JobManager::OnNodeHeartbeat(const std::string& node_id, const loom::v1::Heartbeat& heartbeat) {
  std::vector<loom::v1::RankExited> vanished;
  {
    absl::MutexLock lock(&mu_);
    auto pending = unconfirmed_.find(node_id);
    if (pending == unconfirmed_.end()) return;
    const absl::Time registered_at = pending->second;
    unconfirmed_.erase(pending);
    for (const std::string& id : order_) {
      const JobRecord& record = jobs_.at(id);
      // Attempts placed after the registration were launched on this session.
      if (!HoldsDevices(record.job.state()) || record.placed_at >= registered_at) continue;
      for (const auto& p : *record.placement) {
        if (p.node_id() != node_id || record.ranks[p.rank()].exited) continue;
        const bool alive = std::any_of(
            heartbeat.running().begin(), heartbeat.running().end(),
            [&](const loom::v1::RunningRank& r) {
              return r.job_id() == id && r.attempt() == record.job.attempt() && r.rank() == p.rank();
            });
        if (alive) continue;
        loom::v1::RankExited& exit = vanished.emplace_back();
        exit.set_job_id(id);
        exit.set_attempt(record.job.attempt());
        exit.set_rank(p.rank());
        exit.set_exit_code(kExitCrash);
        exit.set_log_tail("(the rank ended while its node was disconnected; its exit was not reported)");
      }
    }
  }
  for (const auto& exit : vanished) OnRankExited(node_id, exit);
}

void JobManager::ObserveIncidentLocked(
    const std::optional<loom::v1::RecoveryIncident>& incident) {
  if (!incident || metrics_ == nullptr) return;
  for (const auto& [phase, seconds] : MeasuredPhases(*incident)) {
    metrics_->ObserveRecoveryPhase(kRecoveryPhaseNames[phase], seconds);
  }
}

void JobManager::IncidentCompletedLocked(
    JobRecord& record, const std::optional<loom::v1::RecoveryIncident>& incident) {
  if (!incident) return;
  ObserveIncidentLocked(incident);
  PersistLocked(record);
}

void JobManager::HandleFailureLocked(JobRecord& record, FailureKind kind,
                                     const std::string& reason, const std::string& node_id,
                                     int32_t rank, absl::Time cause) {
  Job& job = record.job;
  const absl::Time now = absl::Now();
  if (cause > now) cause = now;
  const spec::FaultToleranceSpec& ft = record.spec.fault_tolerance;
  job.set_last_diagnosis(reason);
  // A node that keeps failing this job is cordoned: no new ranks go there.
  if (!node_id.empty() && kind != FailureKind::kJobBroken &&
      ++record.node_failures[node_id] >= ft.cordon_after) {
    const std::string why = absl::StrCat("failed job ", job.id(), " ", record.node_failures[node_id],
                                         " times");
    if (nodes_->Cordon(node_id, why)) {
      std::fprintf(stderr, "node %s: cordoned (%s)\n", node_id.c_str(), why.c_str());
    }
  }
  int64_t budget = 0;
  int32_t used = 0;
  const char* what = "";
  switch (kind) {
    case FailureKind::kCrash:
      budget = ft.max_restarts;
      used = job.crash_restarts();
      what = "crash";
      break;
    case FailureKind::kHang:
      budget = ft.hang_budget();
      used = job.hang_restarts();
      what = "hang";
      break;
    case FailureKind::kNodeLost:
      budget = ft.node_budget();
      used = job.node_restarts();
      what = "lost-node";
      break;
    case FailureKind::kJobBroken:
      break;
  }
  if (kind != FailureKind::kJobBroken && used < budget) {
    switch (kind) {
      case FailureKind::kCrash: job.set_crash_restarts(used + 1); break;
      case FailureKind::kHang: job.set_hang_restarts(used + 1); break;
      case FailureKind::kNodeLost: job.set_node_restarts(used + 1); break;
      case FailureKind::kJobBroken: break;
    }
    job.set_restarts(job.restarts() + 1);
    // Exponential backoff, so a failure that repeats at once does not spin.
    const double backoff =
        std::min(60.0, ft.restart_backoff_s * std::pow(2.0, std::max(0, used)));
    job.set_not_before_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Seconds(backoff)));
    if (metrics_ != nullptr) metrics_->CountRestart(job.id(), job.name());
    // The recovery starts: its phases are accounted until the next attempt's
    // first step (persisted with the transition below).
    const char* incident_kind = kind == FailureKind::kCrash  ? "crash"
                                : kind == FailureKind::kHang ? "hang"
                                                             : "node_lost";
    ObserveIncidentLocked(
        OpenIncident(job, incident_kind, rank, node_id, reason, cause, now));
    TransitionLocked(record, JobState::RESTARTING,
                     absl::StrCat(what, " restart ", used + 1, " of ", budget, ": ", reason));
    KillRanksLocked(record);
    if (record.ranks_exited == record.ranks.size()) {
      FinishAttemptLocked(record);
    }
    return;
  }
  TransitionLocked(record, JobState::FAILED,
                   kind == FailureKind::kJobBroken
                       ? reason
                       : absl::StrCat(reason, " (", what, " restart budget of ", budget, " spent)"));
  KillRanksLocked(record);
  FinishAttemptLocked(record);
}

void JobManager::CheckHealth(absl::Time now) {
  std::set<std::string> missing;  // nodes that did not come back after a restart
  std::vector<std::string> expired;  // jobs past their retention, gone from memory
  {
    absl::MutexLock lock(&mu_);
    expired = SweepEndedJobsLocked(now);
    bool reschedule = false;
    for (const std::string& id : order_) {
      JobRecord& record = jobs_.at(id);
      const JobState state = record.job.state();
      if ((state == JobState::STARTING || state == JobState::RUNNING) && record.hang) {
        if (std::optional<HangReport> hang = record.hang->Check(now)) {
          std::string node;
          if (hang->culprit_rank >= 0 && hang->culprit_rank < record.placement->size()) {
            node = record.placement->Get(hang->culprit_rank).node_id();
          }
          // The hang began when progress stopped.
          HandleFailureLocked(record, FailureKind::kHang, absl::StrCat("hang: ", hang->diagnosis),
                              node, hang->culprit_rank, now - hang->stalled_for);
          reschedule = true;
        }
      }
      if (state == JobState::RESTARTING &&
          absl::ToUnixMillis(now) >= record.job.not_before_unix_ms()) {
        reschedule = true;
      }
      // Goodput falls while a job makes no steps (a recovery, a hang); steps
      // update it too, this keeps the gauge current between them.
      if (!IsTerminal(state) && record.job.first_running_unix_ms() != 0 && metrics_ != nullptr) {
        metrics_->SetJobGoodput(id, record.job.name(), GoodputTracker::Update(record.job, now));
      }
    }
    if (recovered_at_ != absl::InfinitePast() && now - recovered_at_ > options_.recovery_grace) {
      recovered_at_ = absl::InfinitePast();
      for (const std::string& id : order_) {
        const JobRecord& record = jobs_.at(id);
        if (!HoldsDevices(record.job.state())) continue;
        for (const auto& p : *record.placement) {
          std::optional<NodeInfo> node = nodes_->Get(p.node_id());
          if (!node || !node->live) missing.insert(p.node_id());
        }
      }
    }
    if (reschedule) ScheduleLocked();
  }
  for (const std::string& node : missing) {
    std::fprintf(stderr, "node %s: did not reconnect after the coordinator restarted; lost\n",
                 node.c_str());
    OnNodeLost(node, "it did not reconnect after the coordinator restarted");
  }
  // Outside the lock: one transaction however many expired, after their
  // last records (long written: they ended a retention ago).
  if (!expired.empty()) WaitPersisted();
  if (absl::Status s = store_->Delete(expired); !s.ok()) {
    std::fprintf(stderr, "could not delete %zu jobs past their retention: %s\n", expired.size(),
                 std::string(s.message()).c_str());
  }
}

absl::StatusOr<loom::v1::Node> JobManager::Uncordon(const std::string& node_id) {
  if (absl::Status s = nodes_->Uncordon(node_id); !s.ok()) return s;
  std::fprintf(stderr, "node %s: uncordoned\n", node_id.c_str());
  Schedule();
  for (loom::v1::Node& node : ListNodes()) {
    if (node.node_id() == node_id) return node;
  }
  return absl::NotFoundError(absl::StrCat("node ", node_id, " is not known"));
}

std::vector<loom::v1::Node> JobManager::ListNodes() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, int32_t> in_use;
  for (const auto& [id, record] : jobs_) {
    if (!HoldsDevices(record.job.state())) continue;
    for (const auto& p : *record.placement) ++in_use[p.node_id()];
  }
  std::vector<loom::v1::Node> nodes;
  for (const NodeInfo& info : nodes_->AllNodes()) {
    loom::v1::Node& node = nodes.emplace_back();
    node.set_node_id(info.node_id);
    node.set_hostname(info.hostname);
    node.set_address(info.address);
    node.set_live(info.live);
    node.set_cordoned(info.cordoned);
    node.set_cordon_reason(info.cordon_reason);
    node.set_device_kind(info.device_kind);
    node.set_device_count(info.device_count);
    node.set_devices_in_use(in_use[info.node_id]);
    node.set_peak_flops_per_device(info.peak_flops_per_device);
  }
  return nodes;
}

void JobManager::KillRanksLocked(JobRecord& record) {
  std::set<std::string> nodes;
  for (const auto& p : *record.placement) nodes.insert(p.node_id());
  for (const std::string& node : nodes) {
    loom::v1::CoordinatorMessage message;
    message.mutable_kill()->set_job_id(record.job.id());
    message.mutable_kill()->set_attempt(record.job.attempt());
    message.mutable_kill()->set_grace_seconds(options_.kill_grace_seconds);
    QueueSendLocked(node, std::move(message));
  }
}

void JobManager::FinishAttemptLocked(JobRecord& record) {
  // Every rank of the failed attempt is gone: the stopping phase ends.
  if (record.job.state() == JobState::RESTARTING) {
    IncidentCompletedLocked(record, MarkStopped(record.job, absl::Now()));
  }
  if (!record.job.store_namespace().empty()) kv_->DropNamespace(record.job.store_namespace());
  record.job.clear_store_namespace();
}

void JobManager::OnNodeRevived(const std::string& node_id,
                               const std::vector<loom::v1::RunningRank>& running) {
  absl::MutexLock lock(&mu_);
  // While the node was lost its ranks were given up and their attempts moved
  // on; whatever of them still runs there holds devices no one accounts for.
  std::set<std::pair<std::string, int32_t>> stale;
  for (const loom::v1::RunningRank& r : running) {
    auto it = jobs_.find(r.job_id());
    const bool current = it != jobs_.end() && HoldsDevices(it->second.job.state()) &&
                         it->second.job.attempt() == r.attempt() &&
                         r.rank() >= 0 && r.rank() < it->second.placement->size() &&
                         it->second.placement->Get(r.rank()).node_id() == node_id &&
                         !it->second.ranks[r.rank()].exited;
    if (!current) stale.insert({r.job_id(), r.attempt()});
  }
  for (const auto& [job_id, attempt] : stale) {
    loom::v1::CoordinatorMessage message;
    message.mutable_kill()->set_job_id(job_id);
    message.mutable_kill()->set_attempt(attempt);
    message.mutable_kill()->set_grace_seconds(options_.kill_grace_seconds);
    QueueSendLocked(node_id, std::move(message));
  }
  ScheduleLocked();
}

}  // namespace loom::coordinator
