// What the fake nodes of a scheduling run saw, for the checks after it
// (sched_checks.h): every rank launched and every rank that exited, with the
// node, device and time. Thread-safe: every node's session appends to it.
#pragma once

#include <mutex>
#include <vector>

#include "absl/time/time.h"
#include "tools/loadgen/sched_checks.h"

namespace loom::loadgen {

class SchedLedger {
 public:
  explicit SchedLedger(absl::Time origin) : origin_(origin) {}

  void Record(absl::Time when, const std::string& node, int32_t device, const std::string& job_id,
              bool launch) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back({absl::ToDoubleSeconds(when - origin_), node, device, job_id, launch});
  }
  std::vector<DeviceEvent> Events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  // The time the events count from.
  absl::Time origin() const { return origin_; }

 private:
  const absl::Time origin_;
  mutable std::mutex mu_;
  std::vector<DeviceEvent> events_;
};

}  // namespace loom::loadgen
