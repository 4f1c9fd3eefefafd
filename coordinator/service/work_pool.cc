#include "coordinator/service/work_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace loom::coordinator {

WorkPool::WorkPool(int threads, size_t max_queued, Options options)
    : max_queued_(max_queued), options_(options) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkPool::~WorkPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool WorkPool::TrySubmit(std::function<void()> work, const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  // An idle thread takes it at once; otherwise it waits, up to the bound.
  if (queue_.size() >= idle_ + max_queued_) return false;
  if (options_.max_per_key > 0) {
    size_t& mine = per_key_[key];
    if (mine >= options_.max_per_key) return false;
    ++mine;
  }
  queue_.push_back(Item{std::move(work), key});
  return true;
}

void WorkPool::Run() {
  // On Linux, nice applies to the calling thread alone.
  if (options_.nice > 0) {
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), options_.nice);
  }
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      --idle_;
      if (queue_.empty()) return;  // stopping, and nothing is left
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    item.work();
    if (options_.max_per_key > 0) {
      absl::MutexLock lock(&mu_);
      auto it = per_key_.find(item.key);
      if (it != per_key_.end() && --it->second == 0) per_key_.erase(it);
    }
  }
}

}  // namespace loom::coordinator
