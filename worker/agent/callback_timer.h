// One thread that runs callbacks at their time (the store relay's backoff
// before a retry and its waiters' deadlines), so nothing waits on a thread of
// its own. A callback gets true when its time came, false when the timer
// stopped first (it still runs once, on Stop's caller).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loom::agent {

class CallbackTimer {
 public:
  using Callback = std::function<void(bool fired)>;
  CallbackTimer() : thread_([this] { Loop(); }) {}
  ~CallbackTimer() { Stop(); }

  uint64_t After(absl::Time when, Callback callback) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    queue_.emplace(std::pair{when, id}, std::move(callback));
    when_[id] = when;
    cv_.Signal();  // it may be the earliest now
    return id;
  }
  // The callback does not run if it has not yet.
  void Cancel(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = when_.find(id);
    if (it == when_.end()) return;
    queue_.erase(std::pair{it->second, id});
    when_.erase(it);
  }
  void Stop() {
    std::map<std::pair<absl::Time, uint64_t>, Callback> left;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      stop_ = true;
      left.swap(queue_);
      when_.clear();
      cv_.Signal();
    }
    thread_.join();
    for (auto& [unused, callback] : left) callback(false);
  }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      if (queue_.empty()) {
        cv_.Wait(&mu_);
        continue;
      }
      auto first = queue_.begin();
      if (first->first.first > absl::Now()) {
        cv_.WaitWithDeadline(&mu_, first->first.first);
        continue;
      }
      Callback callback = std::move(first->second);
      when_.erase(first->first.second);
      queue_.erase(first);
      mu_.Unlock();
      callback(true);
      mu_.Lock();
    }
  }

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::map<std::pair<absl::Time, uint64_t>, Callback> queue_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::Time> when_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the rest exists
};

}  // namespace loom::agent
