#include "worker/comm/prefix_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::comm {

PrefixStore::PrefixStore(Store& base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}

std::string PrefixStore::FullKey(const std::string& key) const { return absl::StrCat(prefix_, "/", key); }

absl::Status PrefixStore::Set(const std::string& key, const std::string& value) {
  return base_.Set(FullKey(key), value);
}

absl::StatusOr<std::string> PrefixStore::Get(const std::string& key, absl::Duration timeout) {
  return base_.Get(FullKey(key), timeout);
}

absl::StatusOr<int64_t> PrefixStore::Add(const std::string& key, int64_t delta) {
  return base_.Add(FullKey(key), delta);
}

}  // namespace loom::comm
