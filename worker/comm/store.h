// Key-value store used for rendezvous: the coordinator's per-job-attempt store
// over gRPC in production, an in-process map in unit tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until the key exists or the timeout passes (DEADLINE_EXCEEDED).
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Atomically adds delta to the integer stored at key (0 if absent); returns the new value.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
};

}  // namespace loom::comm
