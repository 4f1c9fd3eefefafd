#include "worker/engine/snapshot/snapshot_copier.h"

#include <condition_variable>
#include <deque>
#include <thread>

#include "worker/comm/background_priority.h"

namespace loom::engine {

// Runs posted jobs one after the other on its own thread.
class SerialWorker {
 public:
  explicit SerialWorker(bool background)
      : background_(background), thread_([this] { Run(); }) {}
  ~SerialWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }
  void WaitIdle() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return jobs_.empty() && !busy_; });
  }

 private:
  void Run() {
    // The copies yield the CPU to training (comm/background_priority.h).
    if (background_) comm::LowerThisThreadToBackground();
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left to run
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
      lock.unlock();
      job();
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false;
  bool stopping_ = false;
  const bool background_;
  std::thread thread_;
};

SnapshotCopier::SnapshotCopier(Ring ring, SnapshotTransferOptions options, bool background)
    : ring_(ring), options_(options) {
  if (ring_.to_buddy != nullptr) sender_ = std::make_unique<SerialWorker>(background);
  if (ring_.from_ward != nullptr) receiver_ = std::make_unique<SerialWorker>(background);
}

SnapshotCopier::~SnapshotCopier() {
  sender_.reset();
  receiver_.reset();
}

void SnapshotCopier::SendToBuddy(std::shared_ptr<const Snapshot> snapshot) {
  if (sender_ == nullptr || snapshot == nullptr) return;
  sender_->Post([this, snapshot = std::move(snapshot)] {
    SendResult result;
    result.step = snapshot->step();
    result.status =
        SendSnapshot(*ring_.to_buddy, snapshot->step(), snapshot.get(), options_, &result.stats);
    std::lock_guard<std::mutex> lock(mu_);
    last_send_ = std::move(result);
  });
}

void SnapshotCopier::ReceiveFromWard(int64_t step, std::shared_ptr<Snapshot> into,
                                     std::vector<uint64_t> held,
                                     std::function<void(std::shared_ptr<Snapshot>)> done) {
  if (receiver_ == nullptr || into == nullptr) return;
  receiver_->Post([this, step, into = std::move(into), held = std::move(held),
                   done = std::move(done)]() mutable {
    absl::Status status =
        ReceiveSnapshot(*ring_.from_ward, step, into.get(), options_, nullptr, held);
    if (status.ok() && done) done(std::move(into));
    std::lock_guard<std::mutex> lock(mu_);
    last_receive_ = std::move(status);
  });
}

void SnapshotCopier::WaitIdle() {
  if (sender_ != nullptr) sender_->WaitIdle();
  if (receiver_ != nullptr) receiver_->WaitIdle();
}

SnapshotCopier::SendResult SnapshotCopier::last_send() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_send_;
}

absl::Status SnapshotCopier::last_receive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_receive_;
}

}  // namespace loom::engine
