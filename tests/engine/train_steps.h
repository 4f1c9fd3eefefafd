// Runs a training loop to a step, collecting each step's progress record:
// the engine tests' one way to train a few steps and compare the records.
#pragma once

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "worker/engine/training_loop.h"

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

}  // namespace loom::engine::testing
