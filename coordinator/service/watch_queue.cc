#include "coordinator/service/watch_queue.h"

#include <utility>

namespace loom::coordinator {
namespace {

// A plain progress update: no event and no backlog that a newer one would lose.
bool Coalescable(const loom::v1::WatchJobResponse& update) {
  return update.has_progress() && update.backlog_size() == 0;
}

}  // namespace

bool WatchQueue::Push(loom::v1::WatchJobResponse update) {
  if (!updates_.empty() && updates_.size() >= lossless_ && Coalescable(update) &&
      Coalescable(updates_.back())) {
    updates_.back() = std::move(update);
    return true;
  }
  if (updates_.size() >= max_updates_) return false;
  updates_.push_back(std::move(update));
  return true;
}

std::optional<loom::v1::WatchJobResponse> WatchQueue::Pop() {
  if (updates_.empty()) return std::nullopt;
  loom::v1::WatchJobResponse front = std::move(updates_.front());
  updates_.pop_front();
  return front;
}

}  // namespace loom::coordinator
