// The lifecycle's node events (job_lifecycle.h): a node lost, registered,
// revived, and the first heartbeat after a registration. A registration also
// finishes a restart a previous coordinator left: exits counted again from
// the ranks the node still runs, kills sent again. Ranks a node lists are
// current, a survivor awaiting its EnterEpoch, or stale (killed); those its
// lease paused are resumed when current (ResumeRanks), at a registration or
// any heartbeat that lists them.
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "common/rank_list.h"
#include "coordinator/jobs/job_lifecycle.h"
#include "coordinator/jobs/job_states.h"

namespace loom::coordinator {

using loom::v1::JobState;

void JobLifecycle::OnNodeLost(const std::string& node_id, const std::string& why) {
  // The node's failure began at its last heartbeat (for a session that
  // ended, that is about when it ended).
  std::optional<NodeInfo> info = nodes_->Get(node_id);
  const absl::Time cause = info && info->last_seen != absl::Time() ? info->last_seen : absl::Now();
  absl::MutexLock lock(&table_->mu());
  // A coordinator that stops (or no longer leads) ends every session: that
  // is not the nodes' failure, and nothing may be decided or stored for it.
  if (!table_->ActingLocked()) return;
  unconfirmed_.erase(node_id);
  for (const std::string& id : table_->OrderLocked()) {
    JobRecord& record = table_->AtLocked(id);
    if (!HoldsDevices(record.job.state())) continue;
    bool affected = false;
    for (const auto& p : *record.placement) {
      if (p.node_id() == node_id) affected |= MarkExitedLocked(record, p.rank(), false);
    }
    if (!affected) continue;
    if (record.job.state() == JobState::RESTARTING) {
      if (record.ranks_exited == record.ranks.size()) FinishAttemptLocked(record);
      continue;
    }
    HandleFailureLocked(record, {.kind = FailureKind::kNodeLost,
                                 .reason = absl::StrCat("node ", node_id, " was lost (", why, ")"),
                                 .node_id = node_id,
                                 .rank = -1,
                                 .cause = cause});
  }
  table_->RequestScheduleLocked();
}

JobLifecycle::Listed JobLifecycle::ClassifyLocked(const std::string& node_id,
                                                  const loom::v1::RunningRank& r) const {
  const JobRecord* record = table_->FindLocked(r.job_id());
  if (record == nullptr || !HoldsDevices(record->job.state())) return Listed::kStale;
  const int32_t rank = r.rank();
  if (rank < 0 || rank >= record->placement->size() ||
      rank >= static_cast<int32_t>(record->ranks.size()) ||
      record->placement->Get(rank).node_id() != node_id || record->ranks[rank].exited) {
    return Listed::kStale;
  }
  const InPlaceRecovery* ip = record->in_place.get();
  if (r.attempt() == record->job.attempt()) {
    // A failed rank being killed is not to be kept.
    const bool failed = ip != nullptr && ip->failed.count(rank) > 0 &&
                        (ip->phase == InPlaceRecovery::Phase::kAborting ||
                         ip->phase == InPlaceRecovery::Phase::kDeciding);
    return failed ? Listed::kStale : Listed::kCurrent;
  }
  if (ip != nullptr && ip->phase == InPlaceRecovery::Phase::kRelaunched &&
      r.attempt() == ip->from_attempt && ip->relaunched.count(rank) == 0) {
    return Listed::kAwaitingEpoch;
  }
  return Listed::kStale;
}

void JobLifecycle::KillStaleLocked(
    const std::string& node_id,
    const google::protobuf::RepeatedPtrField<loom::v1::RunningRank>& running) {
  // By rank: other ranks of the same attempt on this node may be current
  // (the survivors of an in-place recovery, beside a failed rank).
  std::map<std::pair<std::string, int32_t>, std::vector<int32_t>> stale;
  for (const loom::v1::RunningRank& r : running) {
    if (ClassifyLocked(node_id, r) == Listed::kStale) stale[{r.job_id(), r.attempt()}].push_back(r.rank());
  }
  for (const auto& [key, ranks] : stale) {
    const auto& [job_id, attempt] = key;
    std::fprintf(stderr,
                 "node %s: runs ranks %s of job %s attempt %d, which are not current; killed\n",
                 node_id.c_str(), RankList({ranks.begin(), ranks.end()}).c_str(), job_id.c_str(),
                 attempt);
    loom::v1::CoordinatorMessage kill = KillMessage(job_id, attempt);
    for (int32_t r : ranks) kill.mutable_kill()->add_ranks(r);
    table_->SendLocked(node_id, std::move(kill));
  }
}

void JobLifecycle::ResumePausedLocked(
    const std::string& node_id,
    const google::protobuf::RepeatedPtrField<loom::v1::RunningRank>& running) {
  loom::v1::CoordinatorMessage message;
  for (const loom::v1::RunningRank& r : running) {
    if (r.paused() && ClassifyLocked(node_id, r) != Listed::kStale) {
      *message.mutable_resume()->add_ranks() = r;
    }
  }
  if (!message.has_resume()) return;
  std::fprintf(stderr, "node %s: resumes %d ranks its lease had paused\n", node_id.c_str(),
               message.resume().ranks_size());
  table_->SendLocked(node_id, std::move(message));
}

void JobLifecycle::ResendInPlaceLocked(
    const std::string& node_id,
    const google::protobuf::RepeatedPtrField<loom::v1::RunningRank>& running) {
  for (const std::string& id : table_->OrderLocked()) {
    JobRecord& record = table_->AtLocked(id);
    InPlaceRecovery* ip = record.in_place.get();
    if (SpillUnderWay(record)) {
      // Survivors here that have not written their part and exited yet.
      const bool waiting = std::any_of(
          running.begin(), running.end(), [&](const loom::v1::RunningRank& r) {
            return r.job_id() == id && r.attempt() == record.job.attempt();
          });
      if (!waiting) continue;
      loom::v1::CoordinatorMessage message;
      *message.mutable_stop() = ip->spill;
      table_->SendAfterStoredLocked(record, node_id, std::move(message));
      continue;
    }
    if (ip == nullptr || record.job.state() != JobState::RECOVERING) continue;
    if (ip->phase == InPlaceRecovery::Phase::kAborting) {
      // Survivors here that have not reported leaving their collectives.
      bool waiting = false;
      for (const auto& p : *record.placement) {
        waiting |= p.node_id() == node_id && ip->failed.count(p.rank()) == 0 &&
                   ip->request.aborted.count(p.rank()) == 0;
      }
      if (!waiting) continue;
      loom::v1::CoordinatorMessage abort;
      abort.mutable_abort()->set_job_id(id);
      abort.mutable_abort()->set_attempt(record.job.attempt());
      abort.mutable_abort()->set_reason(ip->reason);
      table_->SendAfterStoredLocked(record, node_id, std::move(abort));
    } else if (ip->phase == InPlaceRecovery::Phase::kRelaunched) {
      const auto epoch = ip->epochs.find(node_id);
      if (epoch == ip->epochs.end()) continue;
      const bool waiting = std::any_of(
          running.begin(), running.end(), [&](const loom::v1::RunningRank& r) {
            return r.job_id() == id && ClassifyLocked(node_id, r) == Listed::kAwaitingEpoch;
          });
      if (!waiting) continue;
      loom::v1::CoordinatorMessage message;
      *message.mutable_enter_epoch() = epoch->second;
      table_->SendAfterStoredLocked(record, node_id, std::move(message));
    }
  }
}

void JobLifecycle::OnNodeRegistered(const loom::v1::RegisterNode& registration) {
  const std::string& node_id = registration.node_id();
  absl::MutexLock lock(&table_->mu());
  if (!table_->ActingLocked()) return;
  // Ranks this node ran may have ended while no one was listening (a
  // coordinator restart). The agent re-sends those exits right after it
  // registers, so the check waits for its first heartbeat, which follows
  // them on the same stream.
  unconfirmed_[node_id] = absl::Now();
  KillStaleLocked(node_id, registration.running());
  // What its lease paused and is still current goes on; what an in-place
  // recovery told its old session may not have arrived.
  ResumePausedLocked(node_id, registration.running());
  ResendInPlaceLocked(node_id, registration.running());
  ResendStopsLocked(node_id);
  // An attempt being stopped needs no exit's details: a rank the node no
  // longer runs has exited, one it runs is killed (again: the coordinator
  // that sent the kill may have stopped before it left, and the count of
  // exits died with it).
  for (const std::string& id : table_->OrderLocked()) {
    JobRecord& record = table_->AtLocked(id);
    if (record.job.state() != JobState::RESTARTING) continue;
    bool runs = false;
    for (const auto& p : *record.placement) {
      if (p.node_id() != node_id || record.ranks[p.rank()].exited) continue;
      // After an in-place relaunch a survivor may still run in the attempt
      // before (its EnterEpoch never arrived).
      const InPlaceRecovery* ip = record.in_place.get();
      const bool abandoned = ip != nullptr && ip->phase == InPlaceRecovery::Phase::kAbandoned &&
                             ip->relaunched.count(p.rank()) == 0;
      const bool listed = std::any_of(
          registration.running().begin(), registration.running().end(),
          [&](const loom::v1::RunningRank& r) {
            return r.job_id() == id && r.rank() == p.rank() &&
                   (r.attempt() == record.job.attempt() ||
                    (abandoned && r.attempt() == ip->from_attempt));
          });
      if (listed) {
        runs = true;
      } else {
        MarkExitedLocked(record, p.rank(), false);
      }
    }
    if (runs && !SpillUnderWay(record)) {  // a spill's survivors were told again, above
      table_->SendAfterStoredLocked(record, node_id, KillAllMessage(record));
    } else if (!runs && record.ranks_exited == record.ranks.size()) {
      FinishAttemptLocked(record);
    }
  }
  table_->RequestScheduleLocked();
}

void JobLifecycle::OnNodeHeartbeat(const std::string& node_id,
                                   const loom::v1::Heartbeat& heartbeat) {
  std::vector<loom::v1::RankExited> vanished;
  // Ranks its lease paused, though its session never broke (acks that came
  // too late): checked only when there are some.
  const bool paused = std::any_of(heartbeat.running().begin(), heartbeat.running().end(),
                                  [](const loom::v1::RunningRank& r) { return r.paused(); });
  {
    absl::MutexLock lock(&table_->mu());
    if (!table_->ActingLocked()) return;
    if (paused) {
      google::protobuf::RepeatedPtrField<loom::v1::RunningRank> stopped;
      for (const loom::v1::RunningRank& r : heartbeat.running()) {
        if (r.paused()) *stopped.Add() = r;
      }
      KillStaleLocked(node_id, stopped);
      ResumePausedLocked(node_id, stopped);
    }
    auto pending = unconfirmed_.find(node_id);
    if (pending == unconfirmed_.end()) return;
    const absl::Time registered_at = pending->second;
    unconfirmed_.erase(pending);
    for (const std::string& id : table_->OrderLocked()) {
      const JobRecord& record = table_->AtLocked(id);
      // Attempts placed after the registration were launched on this session.
      if (!HoldsDevices(record.job.state()) || record.placed_at >= registered_at) continue;
      for (const auto& p : *record.placement) {
        if (p.node_id() != node_id || record.ranks[p.rank()].exited) continue;
        const bool alive = std::any_of(
            heartbeat.running().begin(), heartbeat.running().end(),
            [&](const loom::v1::RunningRank& r) {
              return r.job_id() == id && r.rank() == p.rank() &&
                     (r.attempt() == record.job.attempt() ||
                      ClassifyLocked(node_id, r) == Listed::kAwaitingEpoch);
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

void JobLifecycle::OnNodeRevived(const std::string& node_id,
                                 const std::vector<loom::v1::RunningRank>& running) {
  absl::MutexLock lock(&table_->mu());
  if (!table_->ActingLocked()) return;
  // While the node was lost its ranks were given up and their attempts moved
  // on; whatever of them still runs there holds devices no one accounts for.
  google::protobuf::RepeatedPtrField<loom::v1::RunningRank> ranks(running.begin(), running.end());
  KillStaleLocked(node_id, ranks);
  table_->RequestScheduleLocked();
}

}  // namespace loom::coordinator
