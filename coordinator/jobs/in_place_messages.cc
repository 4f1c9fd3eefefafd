#include "coordinator/jobs/in_place_messages.h"

namespace loom::coordinator {

std::vector<topology::DeviceSlot> SlotsOf(
    const google::protobuf::RepeatedPtrField<loom::v1::RankPlacement>& placement) {
  std::vector<topology::DeviceSlot> slots(static_cast<size_t>(placement.size()));
  for (const loom::v1::RankPlacement& p : placement) {
    if (p.rank() < 0 || p.rank() >= placement.size()) continue;
    slots[p.rank()] = topology::DeviceSlot{p.node_id(), p.local_device()};
  }
  return slots;
}

loom::v1::SnapshotRing SnapshotRingOf(const topology::SnapshotRing& ring, int64_t rank,
                                      const std::vector<int64_t>& send_to) {
  loom::v1::SnapshotRing out;
  out.set_buddy_rank(static_cast<int32_t>(ring.BuddyOf(rank)));
  out.set_ward_rank(static_cast<int32_t>(ring.WardOf(rank)));
  for (int64_t to : send_to) out.add_send_snapshot_to(static_cast<int32_t>(to));
  return out;
}

void SetSnapshotRings(const topology::SnapshotRing& ring,
                      std::vector<loom::v1::RankAssignment>& assignments) {
  for (loom::v1::RankAssignment& a : assignments) {
    *a.mutable_snapshots() = SnapshotRingOf(ring, a.rank());
  }
}

void ApplyInPlace(const InPlaceDecision& decision,
                  std::vector<loom::v1::RankAssignment>& assignments) {
  static const std::vector<int64_t> kNone;
  for (loom::v1::RankAssignment& a : assignments) {
    auto sends = decision.sends.find(a.rank());
    *a.mutable_snapshots() = SnapshotRingOf(decision.ring, a.rank(),
                                            sends == decision.sends.end() ? kNone : sends->second);
    loom::v1::RestorePlan* restore = a.mutable_restore();
    restore->set_step(decision.restore_step);
    if (const Relaunch* r = decision.RelaunchOf(a.rank())) {
      restore->set_source(loom::v1::RestorePlan::PEER_SNAPSHOT);
      restore->set_peer_rank(static_cast<int32_t>(r->peer));
    } else {
      restore->set_source(loom::v1::RestorePlan::OWN_SNAPSHOT);
      restore->set_peer_rank(-1);
    }
  }
}

std::map<std::string, loom::v1::EnterEpoch> EnterEpochsByNode(
    const InPlaceDecision& decision, const std::vector<loom::v1::RankAssignment>& assignments,
    int32_t from_attempt) {
  std::map<std::string, loom::v1::EnterEpoch> epochs;
  for (const loom::v1::RankAssignment& a : assignments) {
    if (decision.IsRelaunched(a.rank())) continue;
    loom::v1::EnterEpoch& epoch = epochs[a.node_id()];
    if (epoch.job_id().empty()) {
      epoch.set_job_id(a.job_id());
      epoch.set_from_attempt(from_attempt);
      epoch.set_attempt(a.attempt());
      epoch.set_store_namespace(a.store_namespace());
      epoch.set_restore_step(decision.restore_step);
    }
    loom::v1::RankEpoch* rank = epoch.add_ranks();
    rank->set_rank(a.rank());
    rank->set_rank_token(a.rank_token());
    *rank->mutable_snapshots() = a.snapshots();
  }
  return epochs;
}

std::map<std::string, std::vector<int32_t>> RanksByNode(
    const std::vector<topology::DeviceSlot>& slots, const std::vector<int64_t>& ranks) {
  std::map<std::string, std::vector<int32_t>> by_node;
  for (int64_t r : ranks) {
    if (r < 0 || r >= static_cast<int64_t>(slots.size())) continue;
    by_node[slots[r].node_id].push_back(static_cast<int32_t>(r));
  }
  return by_node;
}

}  // namespace loom::coordinator
