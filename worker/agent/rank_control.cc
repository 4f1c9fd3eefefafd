#include "worker/agent/rank_control.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::agent {

using loom::v1::RankControl;

// One Control call. Its fields are guarded by the hub's mutex; a refused
// call has no hub.
class RankControlHub::Stream final : public grpc::ServerWriteReactor<RankControl> {
 public:
  Stream(RankControlHub* hub, uint64_t launch_id) : hub_(hub), launch_id_(launch_id) {}

  void OnWriteDone(bool ok) override {
    if (hub_ != nullptr) hub_->WriteDone(launch_id_, this, ok);
  }
  void OnCancel() override {
    if (hub_ != nullptr) hub_->Cancelled(launch_id_, this);
  }
  void OnDone() override {
    if (hub_ != nullptr) hub_->Done(launch_id_, this);
    delete this;
  }

  void FinishOnce(const grpc::Status& status) {
    if (finished) return;
    finished = true;
    Finish(status);
  }

  RankControl current;  // the message being written
  bool finished = false;

 private:
  RankControlHub* const hub_;
  const uint64_t launch_id_;
};

void RankControlHub::Open(uint64_t launch_id) {
  absl::MutexLock lock(&mu_);
  ranks_.try_emplace(launch_id);
}

void RankControlHub::Close(uint64_t launch_id) {
  absl::MutexLock lock(&mu_);
  auto it = ranks_.find(launch_id);
  if (it == ranks_.end()) return;
  if (it->second.stream != nullptr) it->second.stream->FinishOnce(grpc::Status::OK);
  ranks_.erase(it);
}

void RankControlHub::Push(uint64_t launch_id, RankControl message) {
  absl::MutexLock lock(&mu_);
  auto it = ranks_.find(launch_id);
  if (it == ranks_.end()) return;  // the rank has ended
  Entry& entry = it->second;
  entry.pending.push_back(std::move(message));
  if (entry.pending.size() > kMaxPending) {
    entry.pending.pop_front();
    if (dropped_++ % 100 == 0) {
      fprintf(stderr,
              "loom-worker: a rank keeps more than %zu control messages unread; dropping the "
              "oldest\n",
              kMaxPending);
    }
  }
  PumpLocked(entry);
}

void RankControlHub::PumpLocked(Entry& entry) {
  if (entry.writer != nullptr || entry.stream == nullptr || entry.stream->finished ||
      entry.pending.empty()) {
    return;
  }
  entry.writer = entry.stream;
  entry.writer->current = std::move(entry.pending.front());
  entry.pending.pop_front();
  // Under the lock: the write's reaction never runs inline, on this thread.
  entry.writer->StartWrite(&entry.writer->current);
}

grpc::ServerWriteReactor<RankControl>* RankControlHub::Attach(uint64_t launch_id) {
  auto* stream = new Stream(this, launch_id);
  absl::MutexLock lock(&mu_);
  auto it = ranks_.find(launch_id);
  if (it == ranks_.end()) {
    stream->FinishOnce(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                    "this rank has ended; no control stream for it"));
    return stream;
  }
  Entry& entry = it->second;
  if (entry.stream != nullptr) {
    entry.stream->FinishOnce(grpc::Status(
        grpc::StatusCode::ABORTED, "replaced by a newer Control stream of the same rank"));
  }
  entry.stream = stream;
  PumpLocked(entry);
  return stream;
}

grpc::ServerWriteReactor<RankControl>* RankControlHub::Refuse(grpc::Status status) {
  auto* stream = new Stream(nullptr, 0);
  stream->FinishOnce(status);
  return stream;
}

void RankControlHub::WriteDone(uint64_t launch_id, Stream* stream, bool ok) {
  absl::MutexLock lock(&mu_);
  auto it = ranks_.find(launch_id);
  if (it == ranks_.end()) return;  // the rank ended meanwhile
  Entry& entry = it->second;
  if (entry.writer == stream) entry.writer = nullptr;
  if (!ok) {
    // Not delivered: it goes again, first, on the rank's next stream.
    entry.pending.push_front(std::move(stream->current));
    if (entry.stream == stream) {
      stream->FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke"));
      entry.stream = nullptr;
    }
  }
  PumpLocked(entry);
}

void RankControlHub::Cancelled(uint64_t launch_id, Stream* stream) {
  absl::MutexLock lock(&mu_);
  stream->FinishOnce(grpc::Status::CANCELLED);
  auto it = ranks_.find(launch_id);
  if (it != ranks_.end() && it->second.stream == stream) it->second.stream = nullptr;
}

void RankControlHub::Done(uint64_t launch_id, Stream* stream) {
  absl::MutexLock lock(&mu_);
  auto it = ranks_.find(launch_id);
  if (it == ranks_.end()) return;
  if (it->second.stream == stream) it->second.stream = nullptr;
  if (it->second.writer == stream) it->second.writer = nullptr;
}

size_t RankControlHub::open_ranks() const {
  absl::MutexLock lock(&mu_);
  return ranks_.size();
}

size_t RankControlHub::attached_streams() const {
  absl::MutexLock lock(&mu_);
  size_t attached = 0;
  for (const auto& [id, entry] : ranks_) attached += entry.stream != nullptr ? 1 : 0;
  return attached;
}

int64_t RankControlHub::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace loom::agent
