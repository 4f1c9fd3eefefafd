// The lifecycle's node events (job_lifecycle.h): a node lost, registered,
// revived, and the first heartbeat after a registration. A registration also
// finishes a restart a previous coordinator left: exits counted again from
// the ranks the node still runs, kills sent again.
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
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

void JobLifecycle::KillStaleLocked(
    const std::string& node_id,
    const google::protobuf::RepeatedPtrField<loom::v1::RunningRank>& running) {
  std::set<std::pair<std::string, int32_t>> stale;
  for (const loom::v1::RunningRank& r : running) {
    const JobRecord* record = table_->FindLocked(r.job_id());
    const bool current = record != nullptr && HoldsDevices(record->job.state()) &&
                         record->job.attempt() == r.attempt() && r.rank() >= 0 &&
                         r.rank() < record->placement->size() &&
                         r.rank() < static_cast<int32_t>(record->ranks.size()) &&
                         record->placement->Get(r.rank()).node_id() == node_id &&
                         !record->ranks[r.rank()].exited;
    if (!current) stale.insert({r.job_id(), r.attempt()});
  }
  for (const auto& [job_id, attempt] : stale) {
    std::fprintf(stderr, "node %s: runs ranks of job %s attempt %d, which is not current; killed\n",
                 node_id.c_str(), job_id.c_str(), attempt);
    table_->SendLocked(node_id, KillMessage(job_id, attempt));
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
      const bool listed = std::any_of(
          registration.running().begin(), registration.running().end(),
          [&](const loom::v1::RunningRank& r) {
            return r.job_id() == id && r.attempt() == record.job.attempt() && r.rank() == p.rank();
          });
      if (listed) {
        runs = true;
      } else {
        MarkExitedLocked(record, p.rank(), false);
      }
    }
    if (runs) {
      table_->SendAfterStoredLocked(record, node_id, KillMessage(id, record.job.attempt()));
    } else if (record.ranks_exited == record.ranks.size()) {
      FinishAttemptLocked(record);
    }
  }
  table_->RequestScheduleLocked();
}

void JobLifecycle::OnNodeHeartbeat(const std::string& node_id,
                                   const loom::v1::Heartbeat& heartbeat) {
  std::vector<loom::v1::RankExited> vanished;
  {
    absl::MutexLock lock(&table_->mu());
    if (!table_->ActingLocked()) return;
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
