#include "worker/engine/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace loom::engine {

double LearningRate(const spec::TrainSpec& train, int64_t step) {
  const double peak = train.lr;
  if (train.warmup_steps > 0 && step <= train.warmup_steps) {
    return peak * static_cast<double>(step) / static_cast<double>(train.warmup_steps);
  }
  const double floor = train.min_lr_ratio * peak;
  const int64_t decay_steps = train.steps - train.warmup_steps;
  if (decay_steps <= 0) return peak;
  const double p = std::clamp(
      static_cast<double>(step - train.warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  switch (train.lr_schedule) {
    case spec::LrSchedule::kCosine:
      return floor + (peak - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    case spec::LrSchedule::kLinear:
      return peak - (peak - floor) * p;
    case spec::LrSchedule::kConstant:
      return peak;
  }
  return peak;
}

}  // namespace loom::engine
