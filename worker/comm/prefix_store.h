// A view of a Store that puts every key under a prefix ("job/attempt/group/"),
// so rendezvous of different jobs, attempts and groups never collide.
#pragma once

#include <string>

#include "worker/comm/store.h"

namespace loom::comm {

class PrefixStore : public Store {
 public:
  // Keys become prefix + "/" + key. The base store must outlive this view.
  PrefixStore(Store& base, std::string prefix);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

  const std::string& prefix() const { return prefix_; }
  std::string FullKey(const std::string& key) const;

 private:
  Store& base_;
  std::string prefix_;
};

}  // namespace loom::comm
