// The wire forms of the snapshot ring and of an in-place decision
// (in_place_policy.h): what each rank's assignment carries (its SnapshotRing,
// its RestorePlan) and what each node of the survivors is told (EnterEpoch).
// Pure: the job manager sends what these build.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/topology/placement.h"
#include "common/topology/snapshot_ring.h"
#include "coordinator/jobs/in_place_policy.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

// A job's placement (Job.placement, one entry per rank, in any order) as
// slots indexed by global rank.
std::vector<topology::DeviceSlot> SlotsOf(
    const google::protobuf::RepeatedPtrField<loom::v1::RankPlacement>& placement);

// One rank's place in the ring; send_to: the relaunched ranks it sends their
// copies to at the start of the attempt (in place only).
loom::v1::SnapshotRing SnapshotRingOf(const topology::SnapshotRing& ring, int64_t rank,
                                      const std::vector<int64_t>& send_to = {});

// Every assignment of an attempt gets its place in the ring (by its rank).
// A fresh placement or a whole-job restart: BuildSnapshotRing(placement.slots).
void SetSnapshotRings(const topology::SnapshotRing& ring,
                      std::vector<loom::v1::RankAssignment>& assignments);

// The next attempt's assignments (BuildAssignments over decision.placement)
// get the in-place parts: the new ring with who sends which relaunched rank
// its copy, and the restore plan (a survivor: OWN_SNAPSHOT; a relaunched
// rank: PEER_SNAPSHOT from its old buddy), both at decision.restore_step.
void ApplyInPlace(const InPlaceDecision& decision,
                  std::vector<loom::v1::RankAssignment>& assignments);

// EnterEpoch for each node that runs survivors, from the assignments after
// ApplyInPlace (each survivor's new token and ring, the new namespace).
std::map<std::string, loom::v1::EnterEpoch> EnterEpochsByNode(
    const InPlaceDecision& decision, const std::vector<loom::v1::RankAssignment>& assignments,
    int32_t from_attempt);

// Ranks grouped by the node they are placed on in `slots` (e.g. the failed
// ranks to kill on live nodes, or the survivors' nodes to send AbortRanks to).
std::map<std::string, std::vector<int32_t>> RanksByNode(
    const std::vector<topology::DeviceSlot>& slots, const std::vector<int64_t>& ranks);

}  // namespace loom::coordinator
