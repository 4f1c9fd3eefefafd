// A FIFO thread that runs the data-parallel engine's blocking collectives
// (reduce-scatter, all-gather) in submission order, so they overlap with the
// model's compute on the calling thread. Every rank submits the same
// collectives in the same order, which keeps the group matched; the caller
// must not issue collectives on the same communicator itself while tasks are
// pending (Drain first).
//
// A task must only hand spans to the communicator: no kernels::Ops call (a
// device backend computes on one stream, driven by the training thread) and
// no host access to tensor memory (device memory on a GPU). Whatever follows
// a collective is done by the thread that waits for it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"

namespace loom::engine {

class CommWorker {
 public:
  class Task;
  using Handle = std::shared_ptr<Task>;

  CommWorker();
  ~CommWorker();  // runs what is queued, then stops
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  Handle Submit(std::function<absl::Status()> fn);
  // Blocks until the task has run; returns its status.
  absl::Status Wait(const Handle& task);
  // Blocks until every submitted task has run; returns the first failure
  // among them since the last Drain.
  absl::Status Drain();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Handle> queue_;
  int64_t submitted_ = 0, finished_ = 0;
  absl::Status first_error_;
  bool stop_ = false;
  std::thread thread_;
};

class CommWorker::Task {
 public:
  explicit Task(std::function<absl::Status()> fn) : fn_(std::move(fn)) {}

 private:
  friend class CommWorker;
  std::function<absl::Status()> fn_;
  absl::Status status_;
  bool done_ = false;
};

}  // namespace loom::engine
