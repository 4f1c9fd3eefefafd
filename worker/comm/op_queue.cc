#include "worker/comm/op_queue.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::comm {

void OpState::Finish(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
    done_ = true;
  }
  cv_.notify_all();
}

void OpState::MarkStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = absl::Now();
}

bool OpState::WaitUntil(absl::Time until) {
  std::unique_lock<std::mutex> lock(mu_);
  if (until == absl::InfiniteFuture()) {
    cv_.wait(lock, [&] { return done_; });
    return true;
  }
  const absl::Duration left = std::max(until - absl::Now(), absl::ZeroDuration());
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(left), [&] { return done_; });
}

bool OpState::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

absl::Status OpState::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

absl::Time OpState::started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

OpQueue::OpQueue(std::string group_name) : group_name_(std::move(group_name)) {
  thread_ = std::thread([this] { Run(); });
}

OpQueue::~OpQueue() {
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    dropped.swap(tasks_);
  }
  cv_.notify_all();
  for (Task& task : dropped) {
    task.state->Finish(absl::CancelledError(absl::StrCat(
        "group ", group_name_, ": ", task.op_name, " cancelled: the communicator was destroyed")));
  }
  thread_.join();
}

std::shared_ptr<OpState> OpQueue::Submit(std::string op_name, Fn fn) {
  auto state = std::make_shared<OpState>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      state->Finish(absl::CancelledError(
          absl::StrCat("group ", group_name_, ": ", op_name, " submitted while the communicator shuts down")));
      return state;
    }
    ++issued_;
    tasks_.push_back(Task{std::move(op_name), std::move(fn), state});
  }
  cv_.notify_all();
  return state;
}

CommProgress OpQueue::Progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  CommProgress progress;
  progress.issued = issued_;
  progress.completed = completed_;
  progress.current_op = current_op_;
  progress.current_since = current_since_;
  return progress;
}

void OpQueue::Run() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
      current_op_ = task.op_name;
      current_since_ = absl::Now();
    }
    task.state->MarkStarted();
    absl::Status status = task.fn();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++completed_;
      current_op_.clear();
      current_since_ = absl::InfinitePast();
    }
    task.state->Finish(std::move(status));
  }
}

QueuedWork::QueuedWork(std::shared_ptr<OpState> state, absl::Duration limit,
                       std::function<void()> on_overrun)
    : state_(std::move(state)), limit_(limit), on_overrun_(std::move(on_overrun)) {}

QueuedWork::~QueuedWork() { Wait().IgnoreError(); }

absl::Status QueuedWork::Wait() {
  // Poll in slices so an operation that outlives its limit (a transport wait
  // that the Gloo timeout did not cover) is aborted instead of waited on forever.
  const absl::Duration slice = absl::Milliseconds(200);
  while (!state_->WaitUntil(absl::Now() + slice)) {
    const absl::Time started = state_->started();
    if (started != absl::InfiniteFuture() && absl::Now() - started > limit_ &&
        !overrun_called_.exchange(true)) {
      if (on_overrun_) on_overrun_();
    }
  }
  return state_->status();
}

}  // namespace loom::comm
