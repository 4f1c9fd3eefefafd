// Fault drills: the LOOM_TEST_FAULT environment variable makes a rank kill
// itself (SIGKILL) at a chosen point, or makes a step bad, so tests can check
// recovery from exactly that failure. Format: POINT@STEP[#RANK][:always]
//   POINT  after_step       once step STEP has completed
//          files_written    in the commit of checkpoint STEP, all shards written
//          truncate_shard   same point, after cutting the first shard in half
//          before_metadata  commit of STEP: index written, commit record not
//          before_rename    commit of STEP: all written and synced, not renamed
//          nan_grad         a NaN in this rank's gradient at step STEP (the step is
//                           not applied: docs/fault_tolerance.md, "Bad steps")
//          loss_spike       step STEP's loss x1000 on every rank (no #RANK: the loss
//                           is the job's); rolled back with loss_spike_factor set
//   #RANK  only that global rank (default: every rank that reaches the point)
//   :always  on every attempt (default: the first attempt only)
// Unset in normal runs; an unparsable value is an error at start.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/training_loop.h"

namespace loom::trainer {

struct FaultPlan {
  std::string point;
  int64_t step = 0;
  int32_t rank = -1;  // -1: any
  bool always = false;
};

absl::StatusOr<FaultPlan> ParseFaultPlan(const std::string& text);

// Reads LOOM_TEST_FAULT; installs the checkpoint-commit hook when the plan
// applies to this rank and attempt (and removes one installed before when it
// does not: a rank that recovers in place calls this again for each
// attempt), and returns the per-step check to call after each step (a no-op
// when nothing applies).
absl::StatusOr<std::function<void(int64_t step)>> InstallFaultPlan(int32_t rank, int32_t attempt);

// The bad-step drills (nan_grad, loss_spike) of LOOM_TEST_FAULT for this rank
// and attempt, to set on its training loop; none: all zero.
absl::StatusOr<engine::StepFaults> StepFaultsFor(int32_t rank, int32_t attempt);

}  // namespace loom::trainer
