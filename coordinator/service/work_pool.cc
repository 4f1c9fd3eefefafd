#include "coordinator/service/work_pool.h"

namespace loom::coordinator {

WorkPool::WorkPool(int threads, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkPool::~WorkPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool WorkPool::TrySubmit(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  // An idle thread takes it at once; otherwise it waits, up to the bound.
  if (queue_.size() >= idle_ + max_queued_) return false;
  queue_.push_back(std::move(work));
  return true;
}

void WorkPool::Run() {
  while (true) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      --idle_;
      if (queue_.empty()) return;  // stopping, and nothing is left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

}  // namespace loom::coordinator
