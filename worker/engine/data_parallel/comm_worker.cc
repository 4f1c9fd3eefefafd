#include "worker/engine/data_parallel/comm_worker.h"

namespace loom::engine {

CommWorker::CommWorker() : thread_([this] { Loop(); }) {}

CommWorker::~CommWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CommWorker::Handle CommWorker::Submit(std::function<absl::Status()> fn) {
  auto task = std::make_shared<Task>(std::move(fn));
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(task);
    ++submitted_;
  }
  cv_.notify_all();
  return task;
}

absl::Status CommWorker::Wait(const Handle& task) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return task->done_; });
  return task->status_;
}

absl::Status CommWorker::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_ == submitted_; });
  absl::Status s = first_error_;
  first_error_ = absl::OkStatus();
  return s;
}

void CommWorker::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    Handle task = queue_.front();
    queue_.pop_front();
    lock.unlock();
    absl::Status status = task->fn_();
    lock.lock();
    task->status_ = status;
    task->done_ = true;
    ++finished_;
    if (!status.ok() && first_error_.ok()) first_error_ = status;
    cv_.notify_all();
  }
}

}  // namespace loom::engine
