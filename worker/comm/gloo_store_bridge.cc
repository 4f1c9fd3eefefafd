#include "worker/comm/gloo_store_bridge.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace loom::comm {

GlooStoreBridge::GlooStoreBridge(loom::comm::Store& store, std::string prefix, absl::Duration timeout)
    : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

std::string GlooStoreBridge::FullKey(const std::string& key) const { return absl::StrCat(prefix_, "/", key); }

void GlooStoreBridge::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_.Set(FullKey(key), std::string(data.begin(), data.end()));
  if (!status.ok()) throw gloo::IoException(absl::StrCat("rendezvous store set: ", status.ToString()));
}

std::vector<char> GlooStoreBridge::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_.Get(FullKey(key), timeout_);
  if (!value.ok()) {
    if (absl::IsDeadlineExceeded(value.status())) {
      std::lock_guard<std::mutex> lock(mu_);
      missing_key_ = key;
    }
    throw gloo::IoException(absl::StrCat("rendezvous store get: ", value.status().ToString()));
  }
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreBridge::wait(const std::vector<std::string>& keys) { wait(keys, std::chrono::milliseconds(0)); }

void GlooStoreBridge::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) {
  // Gloo passes its context timeout, which the communicator sets for pair
  // connection; the rendezvous timeout the user configured is the one that
  // bounds waiting for peers to publish their addresses.
  const absl::Time deadline = absl::Now() + timeout_;
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value =
        store_.Get(FullKey(key), std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!value.ok()) {
      if (absl::IsDeadlineExceeded(value.status())) {
        std::lock_guard<std::mutex> lock(mu_);
        missing_key_ = key;
      }
      throw gloo::IoException(absl::StrCat("rendezvous store wait: ", value.status().ToString()));
    }
  }
}

std::string GlooStoreBridge::missing_key() const {
  std::lock_guard<std::mutex> lock(mu_);
  return missing_key_;
}

}  // namespace loom::comm
