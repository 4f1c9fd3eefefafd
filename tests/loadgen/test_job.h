// A job placed node by node for the loadgen tests, and the coordinator's own
// pure in-place pieces over it (coordinator/jobs/in_place_policy.h,
// in_place_messages.h, common/topology/snapshot_ring.h): the assignments the
// real coordinator sends at a launch, and its decision and messages after a
// failure, without its threads. The tests play the coordinator with these,
// so what loadgen's ranks report is judged by the coordinator's own rules.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/topology/placement.h"
#include "common/topology/snapshot_ring.h"
#include "coordinator/jobs/in_place_messages.h"
#include "coordinator/jobs/in_place_policy.h"
#include "loom/v1/node.pb.h"
#include "loom/v1/rank.pb.h"

namespace loom::loadgen::testing {

class TestJob {
 public:
  // The job runs gpus ranks on each of nodes (ranks placed node by node);
  // spare nodes run none until a recovery places ranks there.
  TestJob(std::vector<std::string> nodes, int gpus, std::vector<std::string> spare = {})
      : gpus_(gpus), spare_(std::move(spare)) {
    for (const std::string& node : nodes) {
      all_nodes_.push_back(node);
      for (int d = 0; d < gpus; ++d) slots_.push_back({node, d});
    }
    all_nodes_.insert(all_nodes_.end(), spare_.begin(), spare_.end());
    ring_ = topology::BuildSnapshotRing(slots_);
  }

  static constexpr char kJobId[] = "job-lg-000001";
  static std::string Namespace(int attempt) {
    return absl::StrCat(kJobId, "/attempt-", attempt, "-ns");
  }
  static std::string Token(int attempt, int rank) {
    return absl::StrCat("token-", attempt, "-", rank);
  }

  int world() const { return static_cast<int>(slots_.size()); }
  const std::vector<topology::DeviceSlot>& slots() const { return slots_; }
  const topology::SnapshotRing& ring() const { return ring_; }
  const std::string& NodeOf(int rank) const { return slots_[static_cast<size_t>(rank)].node_id; }

  // Attempt 1: every rank from its (absent) checkpoint, with its place in the ring.
  std::vector<loom::v1::RankAssignment> Launch() const {
    std::vector<loom::v1::RankAssignment> assignments = Assignments(1, slots_);
    coordinator::SetSnapshotRings(ring_, assignments);
    return assignments;
  }

  struct Recovery {
    coordinator::InPlaceDecision decision;
    std::vector<loom::v1::RankAssignment> next;          // every rank's, attempt from + 1
    std::map<std::string, loom::v1::EnterEpoch> epochs;  // by node
  };
  // The coordinator's decision once the survivors reported "aborted", and
  // what it sends: EnterEpoch per node of survivors, next[r] to launch each
  // relaunched rank. In place, the job's placement and ring become the next
  // attempt's.
  absl::StatusOr<Recovery> Recover(const std::set<int64_t>& failed_ranks,
                                   const std::set<std::string>& lost_nodes,
                                   const std::map<int64_t, loom::v1::RankProgress>& aborted,
                                   int64_t newest_step, int32_t from_attempt) {
    coordinator::InPlaceRequest request;
    request.placement = slots_;
    request.ring = ring_;
    request.failed_ranks = failed_ranks;
    request.lost_nodes = lost_nodes;
    for (const std::string& node : all_nodes_) {
      if (lost_nodes.count(node) > 0) continue;
      coordinator::RelaunchNode live{node, {}, false, ""};
      for (int d = 0; d < gpus_; ++d) live.free_devices.push_back(d);
      request.nodes.push_back(live);
    }
    request.aborted = aborted;
    request.newest_step = newest_step;
    absl::StatusOr<coordinator::InPlaceDecision> decision = coordinator::DecideInPlace(request);
    if (!decision.ok()) return decision.status();
    Recovery recovery;
    recovery.decision = *decision;
    if (!decision->in_place) return recovery;
    recovery.next = Assignments(from_attempt + 1, decision->placement);
    coordinator::ApplyInPlace(*decision, recovery.next);
    recovery.epochs = coordinator::EnterEpochsByNode(*decision, recovery.next, from_attempt);
    slots_ = decision->placement;
    ring_ = decision->ring;
    return recovery;
  }

 private:
  std::vector<loom::v1::RankAssignment> Assignments(
      int32_t attempt, const std::vector<topology::DeviceSlot>& slots) const {
    std::vector<loom::v1::RankAssignment> assignments;
    for (size_t r = 0; r < slots.size(); ++r) {
      loom::v1::RankAssignment a;
      a.set_job_id(kJobId);
      a.set_attempt(attempt);
      a.set_rank(static_cast<int32_t>(r));
      a.set_world_size(static_cast<int32_t>(slots.size()));
      a.set_node_id(slots[r].node_id);
      a.set_local_device(static_cast<int32_t>(slots[r].local_device));
      a.set_store_namespace(Namespace(attempt));
      a.set_rank_token(Token(attempt, static_cast<int>(r)));
      a.set_collective_timeout_s(60);
      assignments.push_back(std::move(a));
    }
    return assignments;
  }

  const int gpus_;
  const std::vector<std::string> spare_;
  std::vector<std::string> all_nodes_;
  std::vector<topology::DeviceSlot> slots_;
  topology::SnapshotRing ring_;
};

}  // namespace loom::loadgen::testing
