// Runs a training loop to a step, collecting each step's progress record:
// the engine tests' one way to train a few steps and compare the records,
// directly or through RunTraining (checkpoints and resume).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/engine/training_loop.h"
#include "worker/engine/training_run.h"

namespace loom::engine::testing {

// Steps until the loop has taken `until` steps (or a step fails, which is a
// test failure: the records so far are returned).
inline std::vector<StepProgress> TrainUntil(TrainingLoop& loop, int64_t until) {
  std::vector<StepProgress> out;
  while (loop.step() < until) {
    absl::StatusOr<StepProgress> p = loop.TrainStep();
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) break;
    out.push_back(*p);
  }
  return out;
}

// Steps to the end of the job's train.steps.
inline std::vector<StepProgress> TrainToEnd(TrainingLoop& loop) {
  return TrainUntil(loop, loop.spec().train.steps);
}

// One step's record against the reference run's: the same step, its loss,
// gradient norm and validation loss within `tol` relative. The engine tests'
// one comparison of records, whatever layout trained them.
inline void ExpectStepNear(const StepProgress& got, const StepProgress& want, double tol) {
  EXPECT_EQ(got.step, want.step);
  EXPECT_NEAR(got.loss, want.loss, tol * std::abs(want.loss)) << "step " << want.step;
  EXPECT_NEAR(got.grad_norm, want.grad_norm, tol * want.grad_norm) << "step " << want.step;
  EXPECT_EQ(got.val_loss.has_value(), want.val_loss.has_value()) << "step " << want.step;
  if (got.val_loss && want.val_loss) {
    EXPECT_NEAR(*got.val_loss, *want.val_loss, tol * *want.val_loss) << "step " << want.step;
  }
}

// What a run trained: its steps' records and the parameters it ended with
// (GatherParameters: this rank's stage's and shard's tensors).
struct TrainedSteps {
  std::vector<StepProgress> steps;
  std::vector<float> params;
};

// RunTraining with checkpoints under `root` (resuming from the newest there;
// empty: none) up to `stop_after` (0: the end), as a worker's rank runs it.
inline TrainedSteps RunCheckpointed(TrainingLoop& loop, const std::string& root,
                                    int64_t stop_after = 0) {
  TrainedSteps run;
  RunOptions options;
  options.checkpoint_root = root;
  options.stop_after_step = stop_after;
  options.on_step = [&run](const StepProgress& p) {
    run.steps.push_back(p);
    return absl::OkStatus();
  };
  const absl::Status status = RunTraining(loop, options);
  EXPECT_TRUE(status.ok()) << status;
  const absl::Status gathered = loop.GatherParameters(&run.params);
  EXPECT_TRUE(gathered.ok()) << gathered;
  return run;
}

}  // namespace loom::engine::testing
