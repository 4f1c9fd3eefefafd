// The lifecycle's core (job_lifecycle.h): transitions and their effects,
// rank exits, failures and the recovery policy's two paths, cancels, a job
// loaded at start, the health tick. Node events are in job_lifecycle_nodes.cc,
// progress in job_progress.cc.
#include "coordinator/jobs/job_lifecycle.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "coordinator/jobs/assignment_builder.h"
#include "coordinator/jobs/job_states.h"

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

JobLifecycle::JobLifecycle(LifecycleOptions options, JobTable* table, WatchHub* hub,
                           JobMetrics* metrics, NodeRegistry* nodes, KvStore* kv)
    : options_(std::move(options)),
      table_(table),
      hub_(hub),
      metrics_(metrics),
      nodes_(nodes),
      kv_(kv) {}

bool JobLifecycle::TransitionLocked(JobRecord& record, JobState to, const std::string& message) {
  Job& job = record.job;
  if (!CanTransition(job.state(), to)) return false;
  // An in-place recovery ends with the state it held: joined (RUNNING), or
  // given up. Once its next attempt was placed, survivors the EnterEpoch did
  // not reach may still exit in the attempt before (kAbandoned keeps that).
  // One that found no room restarts the whole job from what its survivors
  // write (kSpilling): kept until the job leaves RESTARTING.
  const bool spilling =
      record.in_place && record.in_place->phase == InPlaceRecovery::Phase::kSpilling;
  if (job.state() == JobState::RECOVERING) {
    const bool placed = job.in_place_from_attempt() > 0;
    job.set_in_place_from_attempt(0);
    if (record.in_place && placed && to != JobState::RUNNING) {
      record.in_place->phase = InPlaceRecovery::Phase::kAbandoned;
    } else if (!(spilling && to == JobState::RESTARTING)) {
      record.in_place.reset();
    }
  } else if (spilling && job.state() == JobState::RESTARTING) {
    record.in_place.reset();
  }
  // An ended job's series leave the scrape after a grace (its history stays
  // in GetJob), so series do not pile up over jobs. Its last incident and
  // goodput are final; they are stored with the transition.
  if (IsTerminal(to)) job.clear_stop();
  if (IsTerminal(to)) {
    const absl::Time now = absl::Now();
    record.drop_metrics_at = now + options_.job_metrics_grace;
    metrics_->Incident(CloseIncident(job, now));
    GoodputTracker::Update(job, now);
    metrics_->Goodput(job);
  }
  table_->TransitionLocked(record, to, message);
  loom::v1::WatchJobResponse update;
  *update.mutable_job() = WatchHub::WatchView(job);
  *update.mutable_event() = job.history(job.history_size() - 1);
  NotifyLocked(record, std::move(update));
  UpdateJobGaugesLocked();
  return true;
}

void JobLifecycle::NotifyLocked(JobRecord& record, loom::v1::WatchJobResponse update) {
  const bool last = IsTerminal(record.job.state());
  table_->AfterStoredLocked(record, [hub = hub_, id = record.job.id(), update = std::move(update),
                                     last] { hub->Push(id, update, last); });
}

void JobLifecycle::UpdateJobGaugesLocked() {
  std::map<JobState, int> counts;
  for (const std::string& id : table_->OrderLocked()) ++counts[table_->AtLocked(id).job.state()];
  metrics_->JobsByState(counts);
}

void JobLifecycle::IncidentCompletedLocked(
    JobRecord& record, const std::optional<loom::v1::RecoveryIncident>& incident) {
  if (!incident) return;
  metrics_->Incident(incident);
  table_->PersistLocked(record, Durability::kSoft);
}

loom::v1::CoordinatorMessage JobLifecycle::KillMessage(const std::string& job_id,
                                                       int32_t attempt) const {
  loom::v1::CoordinatorMessage message;
  message.mutable_kill()->set_job_id(job_id);
  message.mutable_kill()->set_attempt(attempt);
  message.mutable_kill()->set_grace_seconds(options_.kill_grace_seconds);
  return message;
}

loom::v1::CoordinatorMessage JobLifecycle::KillAllMessage(const JobRecord& record) const {
  const bool two_attempts =
      record.job.in_place_from_attempt() > 0 ||
      (record.in_place && record.in_place->phase == InPlaceRecovery::Phase::kAbandoned);
  return KillMessage(record.job.id(), two_attempts ? 0 : record.job.attempt());
}

std::unique_ptr<HangDetector> JobLifecycle::NewHangDetector(const JobRecord& record,
                                                            absl::Time now) const {
  std::vector<std::string> places;
  places.reserve(record.placement->size());
  for (const auto& p : *record.placement) places.push_back(p.place());
  HangPolicy policy = options_.hang_policy;
  policy.fixed_timeout = absl::Seconds(record.spec.fault_tolerance.hang_timeout_s);
  return std::make_unique<HangDetector>(policy, std::move(places), now);
}

bool JobLifecycle::MarkExitedLocked(JobRecord& record, int32_t rank, bool ok) {
  RankState& state = record.ranks[rank];
  if (state.exited) return false;
  state.exited = true;
  state.exit_ok = ok;
  ++record.ranks_exited;
  return true;
}

void JobLifecycle::OnRankExited(const std::string& node_id, const loom::v1::RankExited& exit) {
  absl::MutexLock lock(&table_->mu());
  if (!table_->ActingLocked()) return;
  JobRecord* found = table_->FindLocked(exit.job_id());
  if (found == nullptr) return;
  JobRecord& record = *found;
  Job& job = record.job;
  // An in-place recovery's own exits: the failed ranks it killed, and
  // survivors still reported in the attempt before the one they moved to.
  bool counts_as_current = false;
  if (InPlaceExitLocked(record, node_id, exit, &counts_as_current)) return;
  if ((exit.attempt() != job.attempt() && !counts_as_current) || exit.rank() < 0 ||
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
  // A graceful stop's exits (job_lifecycle_stop.cc).
  if (HoldsDevices(job.state()) && job.state() != JobState::RESTARTING &&
      job.state() != JobState::RECOVERING && StoppedExitLocked(record, node_id, exit)) {
    return;
  }
  const bool ok = exit.signal() == 0 && exit.exit_code() == kExitOk;
  if (!MarkExitedLocked(record, exit.rank(), ok)) return;
  const bool all_exited = record.ranks_exited == record.ranks.size();
  const JobState state = job.state();
  if (state == JobState::RESTARTING) {
    if (all_exited) {
      FinishAttemptLocked(record);
      table_->RequestScheduleLocked();
    }
    return;
  }
  if (!HoldsDevices(state)) return;
  if (ok && state == JobState::RECOVERING) {
    // A rank that finished cannot take part in the next attempt.
    FallBackLocked(record, absl::StrCat("rank ", exit.rank(), " on node ", node_id,
                                        " finished while the job recovered in place"));
    return;
  }
  if (ok) {
    if (all_exited) {
      TransitionLocked(record, JobState::SUCCEEDED,
                       absl::StrCat("all ranks finished ", record.spec.train.steps, " steps"));
      FinishAttemptLocked(record);
      table_->RequestScheduleLocked();
    }
    return;
  }
  const std::string& place = record.placement->Get(exit.rank()).place();
  Failure failure;
  failure.reason = absl::StrCat("rank ", exit.rank(), " ", place, " on node ", node_id, " ",
                                DescribeExit(exit));
  if (!exit.log_tail().empty()) absl::StrAppend(&failure.reason, "; its log ends:\n", exit.log_tail());
  failure.kind = exit.signal() == 0 && exit.exit_code() == kExitJobBroken ? FailureKind::kJobBroken
                                                                           : FailureKind::kCrash;
  failure.node_id = node_id;
  failure.rank = exit.rank();
  // The agent says when it saw the exit; an agent that does not, or an exit
  // found missing at a heartbeat, starts the incident now.
  failure.cause =
      exit.exited_unix_us() > 0 ? absl::FromUnixMicros(exit.exited_unix_us()) : absl::Now();
  HandleFailureLocked(record, failure);
}

void JobLifecycle::HandleFailureLocked(JobRecord& record, const Failure& given) {
  Job& job = record.job;
  if (StopInsteadOfRecoveringLocked(record, given)) return;
  Failure failure = given;
  const absl::Time now = absl::Now();
  if (failure.cause > now) failure.cause = now;
  job.set_last_diagnosis(failure.reason);
  int64_t node_failures = 0;
  if (!failure.node_id.empty() && failure.kind != FailureKind::kJobBroken) {
    node_failures = ++record.node_failures[failure.node_id];
  }
  // A lost node's ranks may act until its lease has run out: the next
  // attempt's commits wait for that, whichever path it takes.
  if (failure.kind == FailureKind::kNodeLost) FenceForLostNodeLocked(job, failure);
  InPlaceRequest request = InPlaceRequestLocked(record, failure);
  const RecoveryDecision decision = DecideRecovery({.job = job,
                                                    .fault_tolerance = record.spec.fault_tolerance,
                                                    .failure = failure,
                                                    .node_failures = node_failures,
                                                    .in_place = &request});
  // A node that keeps failing this job is cordoned: no new ranks go there.
  if (decision.cordon && nodes_->Cordon(failure.node_id, decision.cordon_reason)) {
    std::fprintf(stderr, "node %s: cordoned (%s)\n", failure.node_id.c_str(),
                 decision.cordon_reason.c_str());
  }
  switch (decision.path) {
    case RecoveryPath::kInPlace:
      RecoverInPlaceLocked(record, failure, decision, std::move(request));
      return;
    case RecoveryPath::kWholeJob:
      RestartWholeJobLocked(record, failure, decision);
      return;
    case RecoveryPath::kFail:
      TransitionLocked(record, JobState::FAILED, decision.message);
      KillRanksLocked(record);
      FinishAttemptLocked(record);
      return;
  }
}

void JobLifecycle::RestartWholeJobLocked(JobRecord& record, const Failure& failure,
                                         const RecoveryDecision& decision) {
  Job& job = record.job;
  const absl::Time now = absl::Now();
  CountRestart(job, failure.kind);
  job.set_not_before_unix_ms(absl::ToUnixMillis(now + decision.backoff));
  metrics_->Restart(job);
  // The recovery starts: its phases are accounted until the next attempt's
  // first step (stored with the transition below).
  metrics_->Incident(OpenIncident(job, decision.incident_kind, failure.rank, failure.node_id,
                                  failure.reason, failure.cause, now));
  // Why not in place: the one place the incident's path is written.
  IncidentCompletedLocked(record, MarkWholeJob(job, decision.fallback_reason));
  TransitionLocked(record, JobState::RESTARTING, decision.message);
  KillRanksLocked(record);
  if (record.ranks_exited == record.ranks.size()) FinishAttemptLocked(record);
}

void JobLifecycle::ReconcileExitsLocked(JobRecord& record) {
  const JobState state = record.job.state();
  if (!HoldsDevices(state) || state == JobState::RESTARTING || record.ranks_exited == 0) return;
  for (size_t rank = 0; rank < record.ranks.size(); ++rank) {
    const RankState& r = record.ranks[rank];
    if (!r.exited || r.exit_ok) continue;
    const std::string& node = record.placement->Get(static_cast<int>(rank)).node_id();
    HandleFailureLocked(record, {.kind = FailureKind::kCrash,
                                 .reason = absl::StrCat("rank ", rank, " on node ", node,
                                                        " exited while a cancel was being stored"),
                                 .node_id = node,
                                 .rank = static_cast<int32_t>(rank),
                                 .cause = absl::Now()});
    return;
  }
  if (record.ranks_exited == record.ranks.size()) {
    TransitionLocked(record, JobState::SUCCEEDED,
                     absl::StrCat("all ranks finished ", record.spec.train.steps, " steps"));
    FinishAttemptLocked(record);
  }
}

void JobLifecycle::KillRanksLocked(JobRecord& record) {
  std::set<std::string> nodes;
  for (const auto& p : *record.placement) nodes.insert(p.node_id());
  for (const std::string& node : nodes) {
    table_->SendAfterStoredLocked(record, node, KillAllMessage(record));
  }
}

void JobLifecycle::FinishAttemptLocked(JobRecord& record) {
  // Every rank of the failed attempt is gone: the stopping phase ends.
  if (record.job.state() == JobState::RESTARTING) {
    IncidentCompletedLocked(record, MarkStopped(record.job, absl::Now()));
  }
  if (const std::string ns = record.job.store_namespace(); !ns.empty()) {
    table_->AfterStoredLocked(record, [kv = kv_, ns] { kv->DropNamespace(ns); });
    record.job.clear_store_namespace();
    table_->PersistLocked(record, Durability::kSoft);
  }
}

void JobLifecycle::Cancel(const std::string& id, JobCallback done) {
  absl::Status refused;
  {
    absl::MutexLock lock(&table_->mu());
    JobRecord* record = table_->FindLocked(id);
    auto answer = [done](absl::Status status, std::shared_ptr<const Job> stored) {
      if (!status.ok()) {
        done(status);
        return;
      }
      Job job = *stored;
      job.clear_store_namespace();
      done(std::move(job));
    };
    if (!table_->ActingLocked()) {
      refused = table_->NotActingLocked();
    } else if (record == nullptr) {
      refused = JobTable::NotFound(id);
    } else if (record->job.state() == JobState::CANCELLED && JobTable::Unstored(*record)) {
      // Cancelled already, not stored yet: this caller hears what the first does.
      table_->AwaitStoredLocked(*record, answer, nullptr);
    } else if (IsTerminal(record->job.state())) {
      refused = absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " already ended ", loom::v1::JobState_Name(record->job.state())));
    } else {
      // What a failed write puts back: an ended record changes no more, so
      // nothing else was built on top of the cancel meanwhile.
      Job before = record->job;
      const absl::Time drop_metrics_at = record->drop_metrics_at;
      const bool had_ranks = HoldsDevices(record->job.state());
      TransitionLocked(*record, JobState::CANCELLED, "cancelled by the user");
      if (had_ranks) KillRanksLocked(*record);
      FinishAttemptLocked(*record);
      table_->RequestScheduleLocked();
      table_->AwaitStoredLocked(
          *record, answer,
          [this, id, before = std::move(before), drop_metrics_at]()
              ABSL_NO_THREAD_SAFETY_ANALYSIS {
                JobRecord* r = table_->FindLocked(id);
                if (r == nullptr) return;
                r->job = before;
                r->drop_metrics_at = drop_metrics_at;
                std::fprintf(stderr, "job %s: the cancel could not be stored; it is %s again\n",
                             id.c_str(), loom::v1::JobState_Name(before.state()).c_str());
                UpdateJobGaugesLocked();
                if (table_->ActingLocked()) ReconcileExitsLocked(*r);
              });
    }
  }
  if (!refused.ok()) done(refused);
}

void JobLifecycle::StartAttemptLocked(JobRecord& record, PlacedAttempt attempt) {
  Job& job = record.job;
  const int32_t number = job.attempt() + 1;
  const absl::Time now = absl::Now();
  job.set_attempt(number);
  record.ranks.assign(attempt.assignments.size(), RankState{});
  record.ranks_ready = 0;
  record.ranks_resumed = 0;
  record.ranks_exited = 0;
  record.placement = std::move(attempt.placement);
  record.peak_flops = attempt.peak_flops;
  metrics_->Ranks(job, record.placement->size(), RequestedRanks(record));
  HoldSpares(job, attempt.spares);
  job.set_store_namespace(attempt.store_namespace);
  kv_->OpenNamespace(attempt.store_namespace, CommitFenceOf(job));
  record.in_place.reset();
  record.placed_at = now;
  WatchAttemptLocked(record, now);
  // A recovery's placement phase ends.
  IncidentCompletedLocked(record, MarkPlaced(job, now));
  TransitionLocked(record, JobState::STARTING,
                   absl::StrCat("attempt ", number, " placed on ", attempt.nodes_text));
  // The launches leave once attempt n+1 is stored: no rank acts on an
  // attempt a restarted coordinator would not know.
  for (auto& a : attempt.assignments) {
    loom::v1::CoordinatorMessage message;
    const std::string node = a.node_id();
    *message.mutable_launch()->mutable_assignment() = std::move(a);
    table_->SendAfterStoredLocked(record, node, std::move(message));
  }
}

void JobLifecycle::FailUnplaceableLocked(JobRecord& record, const std::string& why) {
  // Nothing was sent and no node is blamed: the spec is what cannot run.
  TransitionLocked(record, JobState::FAILED, why);
  FinishAttemptLocked(record);
}

void JobLifecycle::RecoveredLocked(JobRecord& record, absl::Time now) {
  Job& job = record.job;
  record.ranks.assign(record.placement->size(), RankState{});
  if (!HoldsDevices(job.state()) || job.attempt() == 0) return;
  // Ranks of a live attempt may still meet in its namespace (a job stored
  // before namespaces had random names uses the readable one).
  if (job.store_namespace().empty()) job.set_store_namespace(StoreNamespace(job.id(), job.attempt()));
  // With the fence it was opened with: a lost node's stale ranks may still
  // try to commit.
  kv_->OpenNamespace(job.store_namespace(), CommitFenceOf(job));
  // Ranks may still be running: watch them for hangs from now on, and give
  // their nodes recovery_grace to reconnect.
  WatchAttemptLocked(record, now);
  recovered_at_ = now;
  if (job.state() == JobState::RECOVERING && job.in_place_from_attempt() == 0) {
    // The survivors' reports went with the previous coordinator and nothing
    // was placed: the whole job restarts (its restart was counted when the
    // recovery began); its ranks are stopped as their nodes register.
    const std::string why = "the coordinator restarted during the recovery, before it was decided";
    IncidentCompletedLocked(record, MarkWholeJob(job, why));
    TransitionLocked(record, JobState::RESTARTING,
                     absl::StrCat(why, "; the whole job restarts from its newest checkpoint"));
  }
  // Attempt n+1 of an in-place recovery was stored (in_place_from_attempt):
  // it is finished like a start. Its ranks' reports make it RUNNING; a rank
  // its node does not run (an EnterEpoch or a launch that never left) is a
  // failure at that node's first heartbeat, and the whole job restarts.
}

void JobLifecycle::CheckHealth(absl::Time now) {
  std::set<std::string> missing;  // nodes that did not come back after a restart
  {
    absl::MutexLock lock(&table_->mu());
    if (!table_->ActingLocked()) return;
    bool reschedule = false;
    for (const std::string& id : table_->OrderLocked()) {
      JobRecord& record = table_->AtLocked(id);
      const JobState state = record.job.state();
      // In place, the abort deadline.
      if (state == JobState::RECOVERING) CheckAbortsLocked(record, now);
      // A spill's deadline.
      if (state == JobState::RESTARTING) CheckSpillDeadlineLocked(record, now);
      // A graceful stop's deadline.
      if (state == JobState::RUNNING || state == JobState::STARTING) {
        CheckStopDeadlineLocked(record, now);
      }
      // A relaunched attempt that never joins is a hang like a start's.
      const bool joining =
          state == JobState::RECOVERING && record.job.in_place_from_attempt() > 0;
      if ((state == JobState::STARTING || state == JobState::RUNNING || joining) && record.hang) {
        if (std::optional<HangReport> hang = record.hang->Check(now)) {
          std::string node;
          if (hang->culprit_rank >= 0 && hang->culprit_rank < record.placement->size()) {
            node = record.placement->Get(hang->culprit_rank).node_id();
          }
          // The hang began when progress stopped.
          HandleFailureLocked(record, {.kind = FailureKind::kHang,
                                       .reason = absl::StrCat("hang: ", hang->diagnosis),
                                       .node_id = node,
                                       .rank = hang->culprit_rank,
                                       .cause = now - hang->stalled_for});
          reschedule = true;
        }
      }
      if (state == JobState::RESTARTING &&
          absl::ToUnixMillis(now) >= record.job.not_before_unix_ms()) {
        reschedule = true;
      }
      // An elastic job below its size grows back (job_lifecycle_elastic.cc).
      if (state == JobState::RUNNING && CheckGrowLocked(record, now)) reschedule = true;
      // Goodput falls while a job makes no steps (a recovery, a hang); steps
      // update it too, this keeps the gauge current between them.
      if (!IsTerminal(state) && record.job.first_running_unix_ms() != 0) {
        GoodputTracker::Update(record.job, now);
        metrics_->Goodput(record.job);
      }
    }
    if (recovered_at_ != absl::InfinitePast() && now - recovered_at_ > options_.recovery_grace) {
      recovered_at_ = absl::InfinitePast();
      for (const std::string& id : table_->OrderLocked()) {
        const JobRecord& record = table_->AtLocked(id);
        if (!HoldsDevices(record.job.state())) continue;
        for (const auto& p : *record.placement) {
          std::optional<NodeInfo> node = nodes_->Get(p.node_id());
          if (!node || !node->live) missing.insert(p.node_id());
        }
      }
    }
    if (reschedule) table_->RequestScheduleLocked();
  }
  for (const std::string& node : missing) {
    std::fprintf(stderr, "node %s: did not reconnect after the coordinator restarted; lost\n",
                 node.c_str());
    OnNodeLost(node, "it did not reconnect after the coordinator restarted");
  }
}

}  // namespace loom::coordinator
