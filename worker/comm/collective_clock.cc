#include "worker/comm/collective_clock.h"

#include <algorithm>

namespace loom::comm {
namespace {

constexpr size_t kMaxBlockedSpans = 4096;
constexpr size_t kMaxStalls = 256;

}  // namespace

void CollectiveClock::BeginStep(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  step_start_ = now;
  ops_.clear();
  blocked_spans_.clear();
  stalls_.clear();
}

void CollectiveClock::RecordStall(absl::Time from, absl::Time to) {
  std::lock_guard<std::mutex> lock(mu_);
  if (step_start_ == absl::InfinitePast() || to <= from || stalls_.size() >= kMaxStalls) return;
  stalls_.emplace_back(std::max(from, step_start_), to);
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
  const Span span{std::max(entered, step_start_), entered + blocked};
  if (span.second > span.first) {
    if (!blocked_spans_.empty() && span.first <= blocked_spans_.back().second &&
        span.second >= blocked_spans_.back().first) {
      Span& last = blocked_spans_.back();
      last = {std::min(last.first, span.first), std::max(last.second, span.second)};
    } else if (blocked_spans_.size() < kMaxBlockedSpans) {
      blocked_spans_.push_back(span);
    }
  }
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
  for (const Span& stall : stalls_) {
    const absl::Time end = std::min(stall.second, now);
    if (end <= stall.first) continue;
    out.stalled += end - stall.first;
    for (const Span& b : blocked_spans_) {
      const absl::Time from = std::max(stall.first, b.first);
      const absl::Time to = std::min(end, b.second);
      if (to > from) out.stalled_while_blocked += to - from;
    }
  }
  // Spans of asynchronous calls may overlap earlier ones: never more than
  // the time blocked.
  out.stalled_while_blocked = std::min({out.stalled_while_blocked, out.blocked, out.stalled});
  return out;
}

}  // namespace loom::comm
