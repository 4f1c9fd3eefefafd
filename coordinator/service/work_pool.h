// A few threads and a bounded queue, for work a gRPC reaction must not do
// itself (a planner search, a token write that fsyncs or goes to etcd): the
// reaction hands the work over and returns; the work finishes the call.
// TrySubmit refuses when the queue is full, so a burst is answered
// RESOURCE_EXHAUSTED at once instead of piling up threads or memory.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace loom::coordinator {

class WorkPool {
 public:
  // threads run the work; at most max_queued wait besides what runs.
  WorkPool(int threads, size_t max_queued);
  // Runs what was queued, then ends the threads.
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues work; false (and nothing queued) when the pool is full.
  bool TrySubmit(std::function<void()> work);
  // The most calls the pool holds at once: running plus queued.
  size_t capacity() const { return threads_.size() + max_queued_; }

 private:
  void Run();

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace loom::coordinator
