#include "tools/loadgen/job_clock.h"

#include <algorithm>

namespace loom::loadgen {
namespace {

// Marks rank in seen; true when it was not marked before.
bool Mark(std::vector<bool>& seen, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= seen.size() || seen[rank]) return false;
  seen[rank] = true;
  return true;
}

}  // namespace

void JobClock::BeginAttempt(int32_t attempt, int64_t base_step, int world_size, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (attempt <= view_.attempt) return;
  view_ = View{};
  view_.attempt = attempt;
  view_.base_step = base_step;
  view_.step = base_step;
  view_.world_size = world_size;
  view_.began = now;
  stepping_since_ = absl::InfiniteFuture();
  frozen_step_ = 0;
  resumed_.assign(static_cast<size_t>(std::max(world_size, 0)), false);
  past_.assign(resumed_.size(), false);
}

void JobClock::Resumed(int32_t attempt, int rank, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (attempt != view_.attempt || !Mark(resumed_, rank)) return;
  if (++view_.resumed == view_.world_size) {
    view_.all_resumed = now;
    if (!view_.frozen) stepping_since_ = now;
  }
}

void JobClock::PastFirstStep(int32_t attempt, int rank, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (attempt != view_.attempt || !Mark(past_, rank)) return;
  if (++view_.past_first_step == view_.world_size) view_.all_past_first_step = now;
}

void JobClock::Freeze(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (view_.frozen) return;
  frozen_step_ = ViewLocked(now).step;
  view_.frozen = true;
  view_.frozen_since = now;
}

JobClock::View JobClock::At(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return ViewLocked(now);
}

JobClock::View JobClock::ViewLocked(absl::Time now) const {
  View v = view_;
  if (v.frozen) {
    v.step = frozen_step_;
    v.stepping = false;
    return v;
  }
  v.stepping = now >= stepping_since_;
  if (v.stepping) v.step = v.base_step + (now - stepping_since_) / step_;
  return v;
}

}  // namespace loom::loadgen
