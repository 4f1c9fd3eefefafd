// The recovery policy: what to do about a failure of a job, decided from the
// job's record alone. Pure, so every rule is a unit test: the job fails (the
// job itself is broken, or the failure kind's restart budget is spent), or it
// recovers on one of two paths — in place (the survivors keep their processes
// and roll back to a snapshot, only the failed ranks are relaunched;
// docs/fault_tolerance.md, "In-place recovery") or the whole job restarts from
// its newest checkpoint — and whether the node the failure happened on is
// cordoned. The lifecycle (job_lifecycle.h) carries the decision out.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

// Why an attempt ended early; each kind but kJobBroken has its own budget.
enum class FailureKind { kCrash, kHang, kNodeLost, kJobBroken };

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
  // Wait before the whole job's next attempt is placed.
  absl::Duration backoff = absl::ZeroDuration();
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
  // Whether this coordinator can carry out an in-place recovery at all.
  bool in_place_supported = false;
};

RecoveryDecision DecideRecovery(const RecoveryInput& input);

// Why the job cannot recover in place, or "" when it can (spec, state and the
// coordinator's support; whether the survivors' snapshots allow it is known
// only once they report).
std::string InPlaceRefusal(const RecoveryInput& input);

// Counts a restart decided by DecideRecovery in the job's counters.
void CountRestart(loom::v1::Job& job, FailureKind kind);

const char* FailureKindName(FailureKind kind);

}  // namespace loom::coordinator
