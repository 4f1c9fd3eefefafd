// The coordinator's in-place recovery decision (docs/fault_tolerance.md,
// "In-place recovery"): after a failure, whether the job recovers in place
// (survivors keep their processes and roll back to their own snapshot, only
// the failed ranks are relaunched and get their copy from their buddy) or
// restarts as a whole from its newest checkpoint, and why. Pure: no locks, no
// I/O; the job manager gathers the inputs under its lock and acts on the
// answer.
//
// Two calls, one rule set:
//  * PlanRelaunch at the declaration of the failure, before any report: can
//    the failure be covered in place at all (the spec allows it, every failed
//    rank has a living buddy, there is a device for every relaunched rank)?
//    If not, the whole-job restart starts at once, without an abort.
//  * DecideInPlace once every survivor reported "aborted" (or the abort
//    deadline passed): the same checks on the devices of that moment, plus
//    the restore step from the survivors' SnapshotHoldings.
// With no room for the failed ranks a job that may shrink is not killed at
// once either: both calls answer "spill", and the restore step is written as
// a checkpoint step for the whole job's restart (InPlaceDecision::spill).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "common/topology/placement.h"
#include "common/topology/snapshot_ring.h"
#include "coordinator/jobs/relaunch_placement.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

struct InPlaceRequest {
  spec::FaultToleranceSpec fault_tolerance;
  int64_t tp = 1;  // TP degree: a TP group (tp consecutive ranks) stays on one node
  // The failed attempt: each rank's place (index = global rank) and the ring
  // its ranks sent their snapshots along (empty: BuildSnapshotRing(placement)).
  std::vector<topology::DeviceSlot> placement;
  topology::SnapshotRing ring;
  // What failed: ranks (a crash, a hung culprit) and lost nodes (every rank
  // placed on one failed). Both empty: nothing to relaunch (a hang without a
  // culprit), which is a whole-job restart.
  std::set<int64_t> failed_ranks;
  std::set<std::string> lost_nodes;
  // Live nodes of the job's device kind; order breaks ties.
  std::vector<RelaunchNode> nodes;
  // Nodes that failed this job: used for a moved rank only when no other node
  // has room (a rank's own node and device are still preferred).
  std::set<std::string> avoid;
  // The survivors' "aborted" reports (RankProgress.phase == "aborted"), by
  // rank: their step and SnapshotHoldings. Only DecideInPlace reads them.
  std::map<int64_t, loom::v1::RankProgress> aborted;
  // Where the survivors that had not reported at the abort deadline were by
  // their last health report (HangDetector::DescribeRank), by rank: named in
  // the fallback's reason, so that a rank that never left says where it was.
  std::map<int64_t, std::string> last_seen;
  // Failed ranks whose processes were killed but not seen to exit (a hung
  // culprit): a rank relaunched in their place must not start beside them.
  // Only DecideInPlace reads them.
  std::set<int64_t> not_exited;
  // The newest step the job reported before the failure (Job.last_progress).
  int64_t newest_step = 0;
  // The job may go on re-planned onto fewer devices (fault_tolerance.min_ranks
  // and a checkpoint directory): when the failed ranks find no room, the
  // survivors still abort and report, and write the restore step they and
  // the failed ranks' buddies hold as a checkpoint step (a spill) for the
  // smaller layout to start from, instead of being killed at once.
  bool spill_when_no_room = false;
};

// One relaunched rank.
struct Relaunch {
  int64_t rank = 0;
  topology::DeviceSlot from;  // its place in the failed attempt
  topology::DeviceSlot to;    // its place in the next one
  int64_t peer = -1;          // its buddy in the failed attempt: sends it its copy
  bool moved() const { return !(from == to); }
};

struct InPlaceDecision {
  bool in_place = false;
  // No room for the failed ranks, and the request allows a spill: the
  // survivors write their snapshots of restore_step (and the buddies their
  // failed wards' copies) as a checkpoint step and the whole job restarts
  // from it. fallback_reason says why it cannot stay in place; placement and
  // ring stay empty, relaunched names the failed ranks (`to` = `from`) and
  // their buddies.
  bool spill = false;
  // Why the whole job restarts instead; empty when in place. One sentence a
  // user can act on (it goes to the job's history and the incident).
  std::string fallback_reason;
  // In place: every rank rolls back to (or is given) its snapshot of this
  // step; -1 until DecideInPlace picked it.
  int64_t restore_step = -1;
  int64_t newest_step = 0;           // the newest step reported (job and survivors)
  int64_t steps_recomputed = 0;      // newest_step - restore_step (in place)
  std::vector<Relaunch> relaunched;  // ascending rank
  // The next attempt: every rank's place (survivors where they are) and the
  // ring over it.
  std::vector<topology::DeviceSlot> placement;
  topology::SnapshotRing ring;
  // Old buddy -> the relaunched ranks it sends their copy to, ascending.
  std::map<int64_t, std::vector<int64_t>> sends;

  bool IsRelaunched(int64_t rank) const;
  const Relaunch* RelaunchOf(int64_t rank) const;
};

// Why the spec rules in-place recovery out ("" when it does not): the first
// rule of both calls below, and of the recovery policy (recovery_policy.h).
std::string SpecRefusal(const spec::FaultToleranceSpec& fault_tolerance);

// The ranks that failed: request.failed_ranks and every rank placed on a
// lost node, ascending.
std::vector<int64_t> FailedRanks(const InPlaceRequest& request);

// Whether the failure can be recovered in place, and where each failed rank
// goes; restore_step stays -1. INVALID_ARGUMENT for a malformed request (a
// failed rank outside the placement, a ring of another size).
absl::StatusOr<InPlaceDecision> PlanRelaunch(const InPlaceRequest& request);

// The full decision: PlanRelaunch, then every survivor's report and every
// killed failed rank's exit, then the restore step from the survivors'
// reports (the newest step each survivor holds a snapshot of and whose copy
// the old buddy of each failed rank holds) and the steps recomputed.
absl::StatusOr<InPlaceDecision> DecideInPlace(const InPlaceRequest& request);

}  // namespace loom::coordinator
