// The learning rate of each optimizer step: linear warmup from 0, then decay
// to min_lr_ratio * lr at the last step (cosine, linear) or constant.
#pragma once

#include <cstdint>

#include "common/spec/job_spec.h"

namespace loom::engine {

// step is 1-based (the optimizer step about to be applied), 1 <= step <= train.steps.
//   step <= warmup_steps:  lr * step / warmup_steps
//   after warmup, with p = (step - warmup) / (steps - warmup) in (0, 1]:
//     cosine:   min + (lr - min) * (1 + cos(pi * p)) / 2
//     linear:   lr - (lr - min) * p
//     constant: lr
//   where min = min_lr_ratio * lr.
double LearningRate(const spec::TrainSpec& train, int64_t step);

}  // namespace loom::engine
