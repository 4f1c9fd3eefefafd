// The scheduler's part of an in-place recovery (job_scheduler.h): once the
// survivors have reported (or the abort deadline passed) the lifecycle hands
// over the request; here, without the lock, DecideInPlace chooses the
// restore step and the relaunched ranks' places, and attempt n+1's
// assignments are built over that placement like any attempt's (tokens,
// the new snapshot ring, restore plans, the survivors' EnterEpoch). The
// commit goes back through the lifecycle under the lock, only if the
// recovery is still waiting for it.
#include "absl/strings/str_cat.h"
#include "coordinator/jobs/job_scheduler.h"
#include "coordinator/jobs/job_states.h"

namespace loom::coordinator {

using loom::v1::JobState;

bool JobScheduler::SnapshotRelaunchLocked(Snapshot& snapshot) {
  for (const std::string& id : table_->OrderLocked()) {
    const JobRecord& record = table_->AtLocked(id);
    if (!JobLifecycle::AwaitsRelaunch(record)) continue;
    std::optional<InPlaceRequest> request = lifecycle_->RelaunchRequestLocked(record);
    snapshot.job_id = id;
    snapshot.state = record.job.state();
    snapshot.attempt = record.job.attempt();
    snapshot.spec = record.spec;
    snapshot.resolved_spec_yaml = record.job.resolved_spec_yaml();
    snapshot.owner = record.job.owner();
    snapshot.checkpoint_dir = record.job.checkpoint_dir();
    snapshot.run_uid = record.job.run_uid();
    snapshot.resume_from_uid = record.job.resume_from_uid();
    snapshot.relaunch = std::move(request);
    return true;
  }
  return false;
}

JobScheduler::Result JobScheduler::PlaceInPlace(const Snapshot& snapshot) const {
  Result result;
  absl::StatusOr<InPlaceDecision> decision = DecideInPlace(*snapshot.relaunch);
  if (!decision.ok()) {
    result.fallback = absl::StrCat("the in-place decision failed: ", decision.status().message());
    return result;
  }
  if (decision->spill) {  // no room: the survivors write the restore step instead
    result.in_place = *std::move(decision);
    return result;
  }
  if (!decision->in_place) {
    result.fallback = decision->fallback_reason;
    return result;
  }
  topology::Placement placement;
  placement.slots = decision->placement;
  BuildAttempt(snapshot, placement, &*decision, result);
  if (!result.error.ok()) {
    // The whole job would meet the same limit: it fails when next placed.
    result.fallback = std::string(result.error.message());
    result.error = absl::OkStatus();
    return result;
  }
  for (const Relaunch& r : decision->relaunched) result.nodes.insert(r.to.node_id);
  result.in_place = *std::move(decision);
  return result;
}

bool JobScheduler::CommitInPlaceLocked(const Snapshot& snapshot, Result& result) {
  JobRecord* record = table_->FindLocked(snapshot.job_id);
  // Still the recovery this decided: nothing ended it, nothing placed it.
  if (record == nullptr || record->job.state() != JobState::RECOVERING ||
      record->job.attempt() != snapshot.attempt || !JobLifecycle::AwaitsRelaunch(*record)) {
    return false;
  }
  if (!result.in_place) {
    lifecycle_->FallBackLocked(*record, result.fallback);
    return true;
  }
  if (result.in_place->spill) {
    lifecycle_->SpillLocked(*record, *result.in_place);
    return true;
  }
  // A node chosen for a relaunched rank went away meanwhile: decide again.
  for (const std::string& node : result.nodes) {
    std::optional<NodeInfo> info = nodes_->Get(node);
    if (!info || !info->live || !info->connected) return false;
  }
  lifecycle_->RelaunchInPlaceLocked(*record, std::move(result.attempt), *result.in_place);
  return true;
}

}  // namespace loom::coordinator
