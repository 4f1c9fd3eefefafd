// The lifecycle's in-place path (job_lifecycle.h; docs/fault_tolerance.md,
// "In-place recovery"). A failure declared while RUNNING that the recovery
// policy can cover in place makes the job RECOVERING: once that is stored the
// failed ranks still running are killed and the survivors' agents told to
// abort the attempt. The survivors' "aborted" reports (with the snapshots they
// hold) and the killed ranks' exits are collected until all are in or the
// abort deadline passes; then the scheduler decides (DecideInPlace) and builds
// attempt n+1 without the lock, and commits it here: stored first, then
// EnterEpoch to the survivors' nodes and LaunchRank for the relaunched ranks
// only. RUNNING once every rank is ready in it (job_progress.cc). Anything
// that breaks the recovery — a second failure, the deadline, no common
// snapshot step, no device — falls back to the whole-job restart, with the
// reason in the incident.
#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rank_list.h"
#include "common/topology/node_labels.h"
#include "coordinator/jobs/in_place_messages.h"
#include "coordinator/jobs/job_lifecycle.h"
#include "coordinator/jobs/job_states.h"

namespace loom::coordinator {

using loom::v1::Job;
using loom::v1::JobState;
using Phase = InPlaceRecovery::Phase;

namespace {

// A hung culprit is killed at once: SIGTERM, then SIGKILL a millisecond later
// (a KillRanks grace of 0 means the agent's default).
constexpr double kKillAtOnceSeconds = 0.001;
// A lost node's agent stops its ranks a moment after its lease ran out (its
// watcher wakes, SIGSTOP reaches each group): the fence waits that too.
constexpr absl::Duration kLeaseMargin = absl::Seconds(1);

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

CommitFence CommitFenceOf(const Job& job) {
  if (job.commit_fence_until_unix_ms() <= 0) return {};
  return {.until = absl::FromUnixMillis(job.commit_fence_until_unix_ms()),
          .why = job.commit_fence_reason()};
}

void JobLifecycle::FenceForLostNodeLocked(Job& job, const Failure& failure) const {
  // Its lease ran from a heartbeat it sent before the last one read here.
  const int64_t until = absl::ToUnixMillis(failure.cause + options_.node_timeout + kLeaseMargin);
  if (until <= job.commit_fence_until_unix_ms()) return;
  job.set_commit_fence_until_unix_ms(until);
  job.set_commit_fence_reason(absl::StrCat("node ", failure.node_id,
                                           " was lost and its lease may not have run out"));
}

std::vector<RelaunchNode> JobLifecycle::RelaunchNodesLocked(const JobRecord& record) const {
  const std::string kind = spec::DeviceKindName(record.spec.resources.device);
  // Devices other jobs hold; the job's own count as free (a failed rank's is
  // free once its process is gone, the survivors' stay where they are).
  std::map<std::string, std::set<int32_t>> taken;
  for (const std::string& id : table_->OrderLocked()) {
    const JobRecord& other = table_->AtLocked(id);
    if (&other == &record || !HoldsDevices(other.job.state())) continue;
    for (const auto& p : *other.placement) taken[p.node_id()].insert(p.local_device());
    for (const auto& p : other.job.spare_devices()) taken[p.node_id()].insert(p.local_device());
  }
  std::vector<RelaunchNode> nodes;
  for (const NodeInfo& node : nodes_->LiveNodes()) {
    if (node.device_kind != kind || !node.connected || node.draining) continue;
    RelaunchNode& r = nodes.emplace_back();
    r.node_id = node.node_id;
    r.cordoned = node.cordoned;
    if (auto d = node.labels.find(topology::kNvlinkDomainLabel); d != node.labels.end()) {
      r.nvlink_domain = d->second;
    }
    const auto held = taken.find(node.node_id);
    for (int32_t d = 0; d < node.device_count; ++d) {
      if (held == taken.end() || held->second.count(d) == 0) r.free_devices.push_back(d);
    }
  }
  return nodes;
}

InPlaceRequest JobLifecycle::InPlaceRequestLocked(const JobRecord& record,
                                                  const Failure& failure) const {
  InPlaceRequest request;
  request.fault_tolerance = record.spec.fault_tolerance;
  request.tp = spec::LayoutOf(record.spec).tp;
  request.placement = SlotsOf(*record.placement);
  if (failure.kind == FailureKind::kNodeLost) {
    request.lost_nodes.insert(failure.node_id);
  } else if (failure.rank >= 0) {
    request.failed_ranks.insert(failure.rank);
  }
  request.nodes = RelaunchNodesLocked(record);
  for (const auto& [node, count] : record.node_failures) request.avoid.insert(node);
  request.newest_step = record.job.last_progress().step();
  // A job that may shrink goes on from the step its snapshots hold, written
  // as a checkpoint step, rather than from its newest checkpoint.
  request.spill_when_no_room =
      record.spec.fault_tolerance.min_ranks > 0 && !record.job.checkpoint_dir().empty();
  return request;
}

void JobLifecycle::RecoverInPlaceLocked(JobRecord& record, const Failure& failure,
                                        const RecoveryDecision& decision, InPlaceRequest request) {
  Job& job = record.job;
  const absl::Time now = absl::Now();
  CountRestart(job, failure.kind);
  metrics_->Restart(job);
  metrics_->Incident(OpenIncident(job, decision.incident_kind, failure.rank, failure.node_id,
                                  failure.reason, failure.cause, now));
  auto recovery = std::make_unique<InPlaceRecovery>();
  InPlaceRecovery& ip = *recovery;
  ip.from_attempt = job.attempt();
  const std::vector<int64_t> failed = FailedRanks(request);
  ip.failed.insert(failed.begin(), failed.end());
  IncidentCompletedLocked(record, MarkInPlace(job, failed));
  // A relaunch must not share a place with the process it replaces.
  for (int64_t r : failed) {
    if (!record.ranks[r].exited) request.not_exited.insert(r);
  }
  // Survivors whose collectives failed by themselves (a peer died) reported
  // "aborted" before the failure was declared.
  for (size_t r = 0; r < record.ranks.size(); ++r) {
    const std::optional<loom::v1::RankProgress>& aborted = record.ranks[r].aborted;
    if (ip.failed.count(static_cast<int64_t>(r)) == 0 && aborted.has_value() &&
        aborted->attempt() == job.attempt()) {
      request.aborted[static_cast<int64_t>(r)] = *aborted;
    }
  }
  ip.reason = FirstLine(failure.reason);
  ip.declared = now;
  ip.deadline = now + absl::Seconds(record.spec.fault_tolerance.abort_timeout_s);
  ip.backoff = decision.backoff;
  ip.request = std::move(request);
  record.in_place = std::move(recovery);
  TransitionLocked(record, JobState::RECOVERING, decision.message);

  // Once RECOVERING is stored: the kills, then the aborts.
  const InPlaceRecovery& stored = *record.in_place;
  const std::vector<int64_t> killed(stored.request.not_exited.begin(),
                                    stored.request.not_exited.end());
  for (const auto& [node, ranks] : RanksByNode(stored.request.placement, killed)) {
    loom::v1::CoordinatorMessage kill = KillMessage(job.id(), job.attempt());
    if (failure.kind == FailureKind::kHang || failure.kind == FailureKind::kStraggler) {
      kill.mutable_kill()->set_grace_seconds(kKillAtOnceSeconds);  // nothing of it to save
    }
    for (int32_t r : ranks) kill.mutable_kill()->add_ranks(r);
    table_->SendAfterStoredLocked(record, node, std::move(kill));
  }
  std::vector<int64_t> survivors;
  for (int64_t r = 0; r < static_cast<int64_t>(record.ranks.size()); ++r) {
    if (stored.failed.count(r) == 0) survivors.push_back(r);
  }
  for (const auto& [node, ranks] : RanksByNode(stored.request.placement, survivors)) {
    loom::v1::CoordinatorMessage abort;
    abort.mutable_abort()->set_job_id(job.id());
    abort.mutable_abort()->set_attempt(job.attempt());
    abort.mutable_abort()->set_reason(stored.reason);
    table_->SendAfterStoredLocked(record, node, std::move(abort));
  }
  std::fprintf(stderr, "job %s: recovering in place: ranks %s relaunched after the survivors "
               "abort attempt %d\n",
               job.id().c_str(), RankList(failed).c_str(), job.attempt());
  CheckAbortsLocked(record, now);
}

void JobLifecycle::OnAbortedLocked(JobRecord& record, const loom::v1::RankProgress& progress) {
  InPlaceRecovery* ip = record.in_place.get();
  if (ip == nullptr || ip->phase != Phase::kAborting || progress.attempt() != ip->from_attempt ||
      ip->failed.count(progress.rank()) > 0) {
    return;
  }
  ip->request.aborted[progress.rank()] = progress;
  CheckAbortsLocked(record, absl::Now());
}

void JobLifecycle::CheckAbortsLocked(JobRecord& record, absl::Time now) {
  InPlaceRecovery* ip = record.in_place.get();
  if (ip == nullptr || ip->phase != Phase::kAborting) return;
  const size_t survivors = record.ranks.size() - ip->failed.size();
  const bool all_in = ip->request.aborted.size() >= survivors && ip->request.not_exited.empty();
  if (!all_in && now < ip->deadline) return;
  // The abort phase ends when every survivor left its collectives; past the
  // deadline the decision falls back, naming who did not.
  if (all_in) IncidentCompletedLocked(record, MarkAborted(record.job, now));
  for (int32_t r = 0; !all_in && record.hang != nullptr && r < static_cast<int32_t>(record.ranks.size());
       ++r) {
    if (ip->failed.count(r) == 0 && ip->request.aborted.count(r) == 0) {
      ip->request.last_seen[r] = record.hang->DescribeRank(r, now);
    }
  }
  ip->phase = Phase::kDeciding;
  table_->RequestScheduleLocked();
}

bool JobLifecycle::InPlaceExitLocked(JobRecord& record, const std::string& node_id,
                                     const loom::v1::RankExited& exit, bool* counts_as_current) {
  InPlaceRecovery* ip = record.in_place.get();
  const int32_t rank = exit.rank();
  if (ip == nullptr || rank < 0 || rank >= record.placement->size() ||
      rank >= static_cast<int32_t>(record.ranks.size())) {
    return false;
  }
  switch (ip->phase) {
    case Phase::kAborting:
    case Phase::kDeciding:
      // A failed rank (killed, or found gone) leaving is part of the plan.
      if (record.job.state() != JobState::RECOVERING || exit.attempt() != ip->from_attempt ||
          ip->failed.count(rank) == 0 || record.placement->Get(rank).node_id() != node_id) {
        return false;
      }
      MarkExitedLocked(record, rank, false);
      ip->request.not_exited.erase(rank);
      CheckAbortsLocked(record, absl::Now());
      return true;
    case Phase::kSpilling:
      return false;  // RESTARTING in attempt n: every exit counts as usual
    case Phase::kRelaunched:
    case Phase::kAbandoned:
      // A survivor that EnterEpoch had not reached ends in the attempt before.
      if (exit.attempt() == ip->from_attempt && record.job.attempt() == ip->from_attempt + 1 &&
          ip->relaunched.count(rank) == 0) {
        *counts_as_current = true;
      }
      return false;
  }
  return false;
}

bool JobLifecycle::AwaitsRelaunch(const JobRecord& record) {
  return record.job.state() == JobState::RECOVERING && record.in_place != nullptr &&
         record.in_place->phase == Phase::kDeciding;
}

std::optional<InPlaceRequest> JobLifecycle::RelaunchRequestLocked(const JobRecord& record) const {
  if (!AwaitsRelaunch(record)) return std::nullopt;
  const InPlaceRecovery* ip = record.in_place.get();
  InPlaceRequest request = ip->request;
  // The devices of now, and what failed the job since.
  request.nodes = RelaunchNodesLocked(record);
  request.avoid.clear();
  for (const auto& [node, count] : record.node_failures) request.avoid.insert(node);
  if (record.job.last_progress().attempt() == ip->from_attempt) {
    request.newest_step = std::max(request.newest_step, record.job.last_progress().step());
  }
  return request;
}

void JobLifecycle::RelaunchInPlaceLocked(JobRecord& record, PlacedAttempt attempt,
                                         const InPlaceDecision& decision) {
  Job& job = record.job;
  InPlaceRecovery& ip = *record.in_place;
  const absl::Time now = absl::Now();
  const int32_t from = job.attempt();
  const int32_t number = from + 1;
  MarkRestoreStep(job, decision.restore_step, decision.newest_step);
  const std::string old_namespace = job.store_namespace();
  job.set_attempt(number);
  job.set_in_place_from_attempt(from);
  record.ranks.assign(attempt.assignments.size(), RankState{});
  record.ranks_ready = 0;
  record.ranks_resumed = 0;
  record.ranks_exited = 0;
  record.placement = std::move(attempt.placement);
  record.peak_flops = attempt.peak_flops;
  DropUsedSpares(job, *record.placement);  // a relaunched rank took a spare
  std::vector<int64_t> relaunched;
  std::set<std::string> where;
  // The survivors keep their processes, so their rank entries stay true:
  // only the relaunched ranks register in the new namespace.
  CarriedEntries carried{.from = old_namespace,
                         .survivors = std::vector<bool>(record.ranks.size(), true)};
  for (const Relaunch& r : decision.relaunched) {
    ip.relaunched.insert(r.rank);
    relaunched.push_back(r.rank);
    where.insert(r.to.node_id);
    if (r.rank >= 0 && r.rank < static_cast<int64_t>(carried.survivors.size())) {
      carried.survivors[r.rank] = false;
    }
  }
  job.set_store_namespace(attempt.store_namespace);
  kv_->OpenNamespace(attempt.store_namespace, CommitFenceOf(job), &carried);
  record.placed_at = now;
  WatchAttemptLocked(record, now);
  IncidentCompletedLocked(record, MarkPlaced(job, now));
  ip.phase = Phase::kRelaunched;
  ip.epochs = std::move(attempt.epochs);
  // Attempt n+1 is a hard change: nothing below leaves before it is stored.
  table_->RecordEventLocked(
      record, absl::StrCat("attempt ", number, " in place: ranks ", RankList(relaunched),
                           " relaunched on ", absl::StrJoin(where, ", "),
                           "; the others roll back to their snapshots of step ",
                           decision.restore_step, " (", decision.steps_recomputed,
                           decision.steps_recomputed == 1 ? " step" : " steps", " recomputed)"));
  loom::v1::WatchJobResponse update;
  *update.mutable_job() = WatchHub::WatchView(job);
  *update.mutable_event() = job.history(job.history_size() - 1);
  NotifyLocked(record, std::move(update));
  if (!old_namespace.empty()) {
    table_->AfterStoredLocked(record, [kv = kv_, old_namespace] { kv->DropNamespace(old_namespace); });
  }
  for (const auto& [node, epoch] : ip.epochs) {
    loom::v1::CoordinatorMessage message;
    *message.mutable_enter_epoch() = epoch;
    table_->SendAfterStoredLocked(record, node, std::move(message));
  }
  for (loom::v1::RankAssignment& a : attempt.assignments) {
    if (ip.relaunched.count(a.rank()) == 0) continue;
    loom::v1::CoordinatorMessage message;
    const std::string node = a.node_id();
    *message.mutable_launch()->mutable_assignment() = std::move(a);
    table_->SendAfterStoredLocked(record, node, std::move(message));
  }
}

void JobLifecycle::FallBackLocked(JobRecord& record, const std::string& reason) {
  Job& job = record.job;
  if (job.state() != JobState::RECOVERING) return;
  const absl::Time now = absl::Now();
  IncidentCompletedLocked(record, MarkWholeJob(job, reason));
  // The backoff runs from the declaration, as on the whole-job path.
  const absl::Time not_before =
      record.in_place != nullptr
          ? record.in_place->declared + record.in_place->backoff
          : now + absl::Seconds(record.spec.fault_tolerance.restart_backoff_s);
  job.set_not_before_unix_ms(absl::ToUnixMillis(not_before));
  std::fprintf(stderr, "job %s: the in-place recovery falls back to the whole job: %s\n",
               job.id().c_str(), reason.c_str());
  TransitionLocked(record, JobState::RESTARTING,
                   absl::StrCat("the in-place recovery gave way to restarting the whole job from "
                                "its newest checkpoint: ",
                                reason));
  KillRanksLocked(record);
  if (record.ranks_exited == record.ranks.size()) FinishAttemptLocked(record);
  table_->RequestScheduleLocked();
}

void JobLifecycle::SpillLocked(JobRecord& record, const InPlaceDecision& decision) {
  Job& job = record.job;
  if (job.state() != JobState::RECOVERING || record.in_place == nullptr) return;
  InPlaceRecovery& ip = *record.in_place;
  const absl::Time now = absl::Now();
  const int64_t step = decision.restore_step;
  IncidentCompletedLocked(
      record, MarkWholeJob(job, absl::StrCat(decision.fallback_reason, "; the survivors write "
                                             "their snapshots of step ", step,
                                             " as a checkpoint")));
  job.set_not_before_unix_ms(absl::ToUnixMillis(ip.declared + ip.backoff));
  ip.phase = Phase::kSpilling;
  ip.deadline = now + options_.stop_grace;
  ip.spill.set_job_id(job.id());
  ip.spill.set_attempt(job.attempt());
  ip.spill.set_reason(decision.fallback_reason);
  ip.spill.set_spill_step(step);
  for (int64_t r : ip.failed) ip.spill.add_failed_ranks(static_cast<int32_t>(r));
  std::fprintf(stderr, "job %s: no room in place (%s); the survivors write step %lld\n",
               job.id().c_str(), decision.fallback_reason.c_str(), static_cast<long long>(step));
  TransitionLocked(
      record, JobState::RESTARTING,
      absl::StrCat("the in-place recovery gave way to restarting the whole job from its "
                   "in-memory snapshots of step ", step, " (",
                   decision.steps_recomputed, decision.steps_recomputed == 1 ? " step" : " steps",
                   " to compute again), which the survivors write as a checkpoint: ",
                   decision.fallback_reason));
  std::vector<int64_t> survivors;
  for (int64_t r = 0; r < static_cast<int64_t>(record.ranks.size()); ++r) {
    if (ip.failed.count(r) == 0 && !record.ranks[r].exited) survivors.push_back(r);
  }
  for (const auto& [node, ranks] : RanksByNode(ip.request.placement, survivors)) {
    loom::v1::CoordinatorMessage message;
    *message.mutable_stop() = ip.spill;
    table_->SendAfterStoredLocked(record, node, std::move(message));
  }
  if (record.ranks_exited == record.ranks.size()) FinishAttemptLocked(record);
  table_->RequestScheduleLocked();
}

bool JobLifecycle::SpillUnderWay(const JobRecord& record) {
  return record.job.state() == JobState::RESTARTING && record.in_place != nullptr &&
         record.in_place->phase == Phase::kSpilling &&
         record.in_place->deadline != absl::InfiniteFuture();
}

void JobLifecycle::CheckSpillDeadlineLocked(JobRecord& record, absl::Time now) {
  InPlaceRecovery* ip = record.in_place.get();
  if (ip == nullptr || ip->phase != Phase::kSpilling || now < ip->deadline) return;
  ip->deadline = absl::InfiniteFuture();  // once: the kills' exits finish the attempt
  table_->RecordEventLocked(
      record, absl::StrCat("the survivors did not write their snapshots of step ",
                           ip->spill.spill_step(), " within ",
                           absl::FormatDuration(options_.stop_grace),
                           "; killed: the job restarts from its newest checkpoint"));
  KillRanksLocked(record);
}

}  // namespace loom::coordinator
