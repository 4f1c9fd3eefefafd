// The recovery policy: what to do about a failure of a job, decided from the
// job's record alone. Pure, so every rule is a unit test: the job fails (the
// job itself is broken, or the failure kind's restart budget is spent), or it
// recovers on one of two paths — in place (the survivors keep their processes
// and roll back to a snapshot, only the failed ranks are relaunched;
// docs/fault_tolerance.md, "In-place recovery") or the whole job restarts from
// its newest checkpoint — and whether the node the failure happened on is
// cordoned. It decides the budget and the path; whether the failure can be
// covered in place at all, and where the failed ranks would go, is
// in_place_policy.h's PlanRelaunch, which it calls: one rulebook for "in place
// or the whole job". The lifecycle (job_lifecycle.h) carries the decision out.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "coordinator/jobs/in_place_policy.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

// Why an attempt ended early; each kind but kJobBroken has its own budget.
// kStraggler: a rank the straggler detector flagged, replaced on
// fault_tolerance.straggler: replace (it counts against the hang budget: a
// slow rank is a partial hang), its node cordoned.
enum class FailureKind { kCrash, kHang, kNodeLost, kJobBroken, kStraggler };

// A failure the coordinator declared.
struct Failure {
  FailureKind kind = FailureKind::kCrash;
  std::string reason;   // names the rank or node, and what happened
  std::string node_id;  // where it happened ("" when no node is to blame)
  int32_t rank = -1;    // the rank that failed or was blamed; -1: a whole node
  absl::Time cause = absl::InfiniteFuture();  // when it happened (its incident's start)
};

enum class RecoveryPath { kFail, kWholeJob, kInPlace };

struct RecoveryDecision {
  RecoveryPath path = RecoveryPath::kFail;
  // The job's history line (and, when it fails, its failure reason).
  std::string message;
  // Set when the whole job restarts although in place was asked for: why not.
  std::string fallback_reason;
  // The failure kind's budget and this restart's number within it (restarts).
  int64_t budget = 0;
  int32_t restart_number = 0;
  // Wait before the whole job's next attempt is placed (also set in place:
  // the wait should the recovery fall back to the whole job).
  absl::Duration backoff = absl::ZeroDuration();
  // In place: the failed ranks and where they would be relaunched
  // (PlanRelaunch; the restore step is chosen once the survivors reported).
  InPlaceDecision relaunch;
  // Cordon failure.node_id (it failed this job cordon_after times).
  bool cordon = false;
  std::string cordon_reason;
  // The incident's kind (crash | hang | node_lost); empty when none is opened.
  std::string incident_kind;
};

struct RecoveryInput {
  const loom::v1::Job& job;  // its state and restart counters before this failure
  const spec::FaultToleranceSpec& fault_tolerance;
  const Failure& failure;
  // Failures of this job on failure.node_id, this one included.
  int64_t node_failures = 0;
  // What an in-place recovery would start from (the failed attempt's
  // placement, the failed ranks or lost nodes, the live nodes and their free
  // devices; in_place_policy.h); null: the whole job restarts.
  const InPlaceRequest* in_place = nullptr;
};

RecoveryDecision DecideRecovery(const RecoveryInput& input);

// Why the job cannot recover in place, or "" when PlanRelaunch is to decide:
// the spec (in_place_policy.h's first rule), then the job's state — a second
// failure while recovering in place, an attempt that had not started
// training (no snapshot yet) — then the lack of a request.
std::string InPlaceRefusal(const RecoveryInput& input);

// Counts a restart decided by DecideRecovery in the job's counters.
void CountRestart(loom::v1::Job& job, FailureKind kind);

const char* FailureKindName(FailureKind kind);

}  // namespace loom::coordinator
