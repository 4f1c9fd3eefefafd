// The "state" of a checkpoint step's metadata: what a training loop needs to
// go on from the step besides the tensors (the tokens seen, the optimizer's
// step, the data position and the random streams, which are functions of
// the step, docs/engine.md) and the layout that wrote it (for a reader; any
// layout loads it). One definition for every writer of a step: the training
// loop's checkpoints and the in-memory snapshots written as a step
// (snapshot_spill.h).
#pragma once

#include <cstdint>

#include "common/spec/job_spec.h"
#include "nlohmann/json.hpp"

namespace loom::engine {

struct WrittenLayout {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1, ep = 1, zero_stage = 0;
};

struct StepCounters {
  int64_t step = 0;  // optimizer steps completed
  int64_t tokens = 0;
  int64_t optimizer_step = 0;
};

nlohmann::json ResumeState(const spec::JobSpec& spec, const WrittenLayout& layout,
                           const StepCounters& counters);

}  // namespace loom::engine
