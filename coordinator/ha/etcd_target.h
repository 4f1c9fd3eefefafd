// The --state=etcd://HOST:PORT[,HOST:PORT...]/PREFIX flag: which etcd members
// to talk to and under which key prefix this Loom cluster keeps its state
// (jobs, leadership, shared secrets). Pure parsing.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::coordinator::ha {

struct EtcdTarget {
  std::vector<std::string> endpoints;  // HOST:PORT of each member, in the order given
  std::string prefix;                  // "/loom/prod": starts with '/', no trailing '/'
};

// INVALID_ARGUMENT naming --state and the rule on a malformed value.
absl::StatusOr<EtcdTarget> ParseEtcdTarget(const std::string& url);

// The end of the key range holding every key that starts with prefix (etcd's
// range_end: prefix with its last byte incremented).
std::string PrefixRangeEnd(const std::string& prefix);

}  // namespace loom::coordinator::ha
