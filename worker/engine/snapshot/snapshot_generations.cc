#include "worker/engine/snapshot/snapshot_generations.h"

#include <algorithm>

namespace loom::engine {

SnapshotGenerations::SnapshotGenerations(size_t generations)
    : generations_(std::max<size_t>(1, generations)) {}

std::shared_ptr<Snapshot> SnapshotGenerations::BeginWrite() {
  std::lock_guard<std::mutex> lock(mu_);
  // With all generations complete, the oldest is overwritten; with fewer,
  // all stay and one more buffer exists only while this one is written.
  if (complete_.size() >= generations_ && complete_.front().use_count() == 1) {
    std::shared_ptr<Snapshot> reused = std::move(complete_.front());
    complete_.pop_front();
    return reused;
  }
  if (complete_.size() >= generations_) complete_.pop_front();  // a reader keeps it alive
  return std::make_shared<Snapshot>();
}

void SnapshotGenerations::Commit(std::shared_ptr<Snapshot> written) {
  if (written == nullptr || written->empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t step = written->step();
  complete_.erase(std::remove_if(complete_.begin(), complete_.end(),
                                 [step](const auto& s) { return s->step() == step; }),
                  complete_.end());
  complete_.push_back(std::move(written));
  std::sort(complete_.begin(), complete_.end(),
            [](const auto& a, const auto& b) { return a->step() < b->step(); });
  while (complete_.size() > generations_) complete_.pop_front();
}

std::vector<int64_t> SnapshotGenerations::Steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> out;
  for (const auto& s : complete_) out.push_back(s->step());
  return out;
}

std::shared_ptr<const Snapshot> SnapshotGenerations::Find(int64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& s : complete_) {
    if (s->step() == step) return s;
  }
  return nullptr;
}

std::shared_ptr<Snapshot> SnapshotGenerations::FindWritable(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& s : complete_) {
    if (s->step() == step) return s;
  }
  return nullptr;
}

int64_t SnapshotGenerations::newest_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return complete_.empty() ? 0 : complete_.back()->size_bytes();
}

void SnapshotGenerations::DropAfter(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  complete_.erase(std::remove_if(complete_.begin(), complete_.end(),
                                 [step](const auto& s) { return s->step() > step; }),
                  complete_.end());
}

void SnapshotGenerations::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  complete_.clear();
}

}  // namespace loom::engine
