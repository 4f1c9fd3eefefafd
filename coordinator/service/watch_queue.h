// The updates waiting to be written to one WatchJob stream. A watcher that
// keeps up loses nothing; one that reads slowly (or never) must not grow the
// coordinator: past a short backlog, consecutive progress updates coalesce
// into the newest one (a watcher that lags sees fewer steps, never stale
// ones), and state changes, which are few per job, are kept up to a bound past
// which the watcher is dropped.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>

#include "loom/v1/job.pb.h"

namespace loom::coordinator {

class WatchQueue {
 public:
  static constexpr size_t kDefaultMaxUpdates = 256;
  static constexpr size_t kDefaultLosslessUpdates = 64;

  // Up to `lossless` updates queue as they are; beyond that progress
  // coalesces; beyond `max_updates` the queue refuses.
  explicit WatchQueue(size_t max_updates = kDefaultMaxUpdates,
                      size_t lossless = kDefaultLosslessUpdates)
      : max_updates_(max_updates), lossless_(lossless) {}

  // Queues an update; false when the queue is full (the watcher is too slow
  // and its stream should end).
  bool Push(loom::v1::WatchJobResponse update);
  std::optional<loom::v1::WatchJobResponse> Pop();
  bool empty() const { return updates_.empty(); }
  size_t size() const { return updates_.size(); }

 private:
  const size_t max_updates_;
  const size_t lossless_;
  std::deque<loom::v1::WatchJobResponse> updates_;
};

}  // namespace loom::coordinator
