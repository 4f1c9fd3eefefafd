// A thread-safe in-memory Store, so unit tests can run several ranks as
// threads of one process without a coordinator.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "worker/comm/store.h"

namespace loom::comm {

class InProcessStore : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  // The value at key must be a decimal integer (as Add writes it) or absent.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

  // Number of keys, for tests that check namespacing.
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace loom::comm
