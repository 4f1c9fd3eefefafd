// A value every coordinator of an etcd-backed cluster must agree on (the
// rank-token key, the job-id prefix): the first coordinator to ask creates
// it, atomically (create_revision == 0), and everyone reads that one.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/ha/etcd_client.h"

namespace loom::coordinator::ha {

absl::StatusOr<std::string> LoadOrCreateShared(EtcdClient* etcd, const std::string& key,
                                               const std::function<std::string()>& make);

}  // namespace loom::coordinator::ha
