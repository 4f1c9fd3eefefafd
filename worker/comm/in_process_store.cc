#include "worker/comm/in_process_store.h"

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom::comm {

absl::Status InProcessStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InProcessStore::Get(const std::string& key, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  // Waiting on a steady-clock deadline keeps spurious wake-ups from extending it.
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration()));
  const bool found = changed_.wait_until(lock, deadline, [&] { return values_.count(key) > 0; });
  if (!found) {
    return absl::DeadlineExceededError(
        absl::StrCat("store: key '", key, "' not set within ", absl::FormatDuration(timeout)));
  }
  return values_.at(key);
}

absl::StatusOr<int64_t> InProcessStore::Add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store: Add on key '", key, "' whose value '", it->second, "' is not an integer"));
    }
    value += delta;
    values_[key] = absl::StrCat(value);
  }
  changed_.notify_all();
  return value;
}

size_t InProcessStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.size();
}

}  // namespace loom::comm
