#include "worker/comm/stall_watch.h"

#include <chrono>

#include "absl/time/clock.h"

namespace loom::comm {

StallWatch::StallWatch(OnStall on_stall, absl::Duration tick, absl::Duration min_stall)
    : on_stall_(std::move(on_stall)), tick_(tick), min_stall_(min_stall),
      thread_([this] { Run(); }) {}

StallWatch::~StallWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StallWatch::Run() {
  using Clock = std::chrono::steady_clock;
  const auto tick = absl::ToChronoNanoseconds(tick_);
  std::unique_lock<std::mutex> lock(mu_);
  Clock::time_point last = Clock::now();
  while (!cv_.wait_for(lock, tick, [this] { return stopping_; })) {
    // The steady clock measures the gap; the wall clock places it, as the
    // collective clock's spans are placed.
    const Clock::time_point woke = Clock::now();
    const absl::Duration late = absl::FromChrono(woke - last) - tick_;
    last = woke;
    if (late <= min_stall_ || !on_stall_) continue;
    const absl::Time now = absl::Now();
    lock.unlock();
    on_stall_(now - late, now);
    lock.lock();
  }
}

}  // namespace loom::comm
