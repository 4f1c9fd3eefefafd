// A few threads and a bounded queue, for work a gRPC reaction must not do
// itself (a planner search, a token write that fsyncs or goes to etcd): the
// reaction hands the work over and returns; the work finishes the call.
// TrySubmit refuses when the queue is full, so a burst is answered
// RESOURCE_EXHAUSTED at once instead of piling up threads or memory.
// Optionally, per key (a caller's name): at most max_per_key of its calls at
// once, so that one caller cannot hold every thread and queue slot; and the
// threads may run at a lower CPU priority (nice), so that CPU-heavy work never
// delays the threads that read heartbeats and sessions on a busy machine.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace loom::coordinator {

class WorkPool {
 public:
  struct Options {
    size_t max_per_key = 0;  // 0: no per-key bound
    int nice = 0;            // added to the threads' nice value (Linux), 0..19
  };
  // threads run the work; at most max_queued wait besides what runs.
  WorkPool(int threads, size_t max_queued) : WorkPool(threads, max_queued, Options{}) {}
  WorkPool(int threads, size_t max_queued, Options options);
  // Runs what was queued, then ends the threads.
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues work; false (and nothing queued) when the pool is full, or when
  // `key` already has max_per_key calls queued or running.
  bool TrySubmit(std::function<void()> work, const std::string& key = "");
  // The most calls the pool holds at once: running plus queued.
  size_t capacity() const { return threads_.size() + max_queued_; }
  size_t max_per_key() const { return options_.max_per_key; }

 private:
  void Run();

  struct Item {
    std::function<void()> work;
    std::string key;
  };
  const size_t max_queued_;
  const Options options_;
  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> per_key_ ABSL_GUARDED_BY(mu_);  // queued or running
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace loom::coordinator
