#include "worker/comm/collective_clock.h"

#include <algorithm>

namespace loom::comm {

void CollectiveClock::BeginStep(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  step_start_ = now;
  ops_.clear();
}

void CollectiveClock::set_observer(CallObserver observer) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = std::move(observer);
}

void CollectiveClock::Record(const std::string& group, const char* op, absl::Time entered,
                             absl::Duration blocked, int64_t bytes) {
  const CallObserver* observer = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!RecordLocked(group, op, entered, blocked)) return;
    // Set once before the groups run: read without copying it.
    if (observer_) observer = &observer_;
  }
  if (observer != nullptr) (*observer)(group, op, entered, blocked, bytes);
}

bool CollectiveClock::RecordLocked(const std::string& group, const char* op, absl::Time entered,
                                   absl::Duration blocked) {
  // Before the first BeginStep (the groups' rendezvous, a restore) nothing
  // belongs to a step.
  if (step_start_ == absl::InfinitePast()) return false;
  const absl::Duration arrival = std::max(entered - step_start_, absl::ZeroDuration());
  auto [it, added] = ops_.try_emplace(std::pair<std::string, std::string>(group, op));
  CollectiveSummary& s = it->second;
  if (added) {
    s.group = group;
    s.op = op;
    s.first_arrival = arrival;
  }
  s.calls += 1;
  s.blocked += blocked;
  s.first_arrival = std::min(s.first_arrival, arrival);
  s.last_arrival = std::max(s.last_arrival, arrival);
  return true;
}

StepCollectives CollectiveClock::Summary(absl::Time now) const {
  std::lock_guard<std::mutex> lock(mu_);
  StepCollectives out;
  if (step_start_ != absl::InfinitePast()) out.elapsed = std::max(now - step_start_, absl::ZeroDuration());
  out.ops.reserve(ops_.size());
  for (const auto& [key, s] : ops_) {
    out.blocked += s.blocked;
    out.ops.push_back(s);
  }
  return out;
}

}  // namespace loom::comm
