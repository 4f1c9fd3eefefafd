// Runs a communicator's operations one at a time, in submission order, on one
// background thread. Every rank submits its collectives in the same order, so
// running them in that order on every rank keeps them matched; asynchronous
// and synchronous calls share the queue, so a blocking call runs only after
// the asynchronous ones submitted before it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace loom::comm {

// Completion state of one queued operation, shared by the queue and its Work.
class OpState {
 public:
  void Finish(absl::Status status);
  void MarkStarted();
  // Waits until finished or until `until`; true when finished.
  bool WaitUntil(absl::Time until);
  bool done() const;
  absl::Status status() const;
  // When the operation began running; InfiniteFuture while still queued.
  absl::Time started() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
  absl::Time started_ = absl::InfiniteFuture();
};

class OpQueue {
 public:
  using Fn = std::function<absl::Status()>;

  // group_name only labels the CANCELLED errors of operations that never ran.
  explicit OpQueue(std::string group_name);
  // Operations not yet started fail with CANCELLED; the running one finishes.
  ~OpQueue();

  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  std::shared_ptr<OpState> Submit(std::string op_name, Fn fn);

  CommProgress Progress() const;

 private:
  struct Task {
    std::string op_name;
    Fn fn;
    std::shared_ptr<OpState> state;
  };

  void Run();

  const std::string group_name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stopping_ = false;
  int64_t issued_ = 0;
  int64_t completed_ = 0;
  std::string current_op_;
  absl::Time current_since_ = absl::InfinitePast();
  std::thread thread_;
};

// The Work of a queued operation. If the operation runs longer than `limit`
// (its timeout plus a grace period) Wait calls on_overrun once, which aborts
// the communicator; Gloo's own timeouts normally fire first. Destroying an
// unfinished QueuedWork waits for it, because the operation still uses the
// caller's buffer.
class QueuedWork : public Work {
 public:
  QueuedWork(std::shared_ptr<OpState> state, absl::Duration limit, std::function<void()> on_overrun);
  ~QueuedWork() override;
  absl::Status Wait() override;

 private:
  std::shared_ptr<OpState> state_;
  absl::Duration limit_;
  std::function<void()> on_overrun_;
  std::atomic<bool> overrun_called_{false};
};

}  // namespace loom::comm
