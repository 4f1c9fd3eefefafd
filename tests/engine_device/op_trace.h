// One rank's record of what it issued, in order: the emulated backend's
// attention ops (a ring's blocks) and the emulated communicator's starts and
// waits of point-to-point batches. Tests read it to see what ran while a
// transfer was in flight (the overlap NCCL gives only if a batch is started
// before the computation, not at its wait).
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace loom::engine::testing {

class OpTrace {
 public:
  void Add(std::string event) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  std::vector<std::string> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> events_;
};

}  // namespace loom::engine::testing
