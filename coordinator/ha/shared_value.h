// Values every coordinator of an etcd-backed cluster must agree on (the
// rank-token key, the job-id prefix): the first coordinator to ask creates
// them, atomically (create_revision == 0), and everyone reads that one. And
// the leader's fenced writes of such values.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/auth/user_tokens.h"
#include "coordinator/ha/etcd_client.h"

namespace loom::coordinator::ha {

absl::StatusOr<std::string> LoadOrCreateShared(EtcdClient* etcd, const std::string& key,
                                               const std::function<std::string()>& make);

// Writes key = value if fence holds (the writer still leads); FencedError
// (jobs/job_store.h) otherwise. For state only the leader changes (the user
// token hashes).
absl::Status FencedPut(EtcdClient* etcd, const etcdserverpb::Compare& fence,
                       const std::string& key, const std::string& value);

// The user-token hashes in one etcd key, written with FencedPut.
auth::TokenPersistence EtcdTokenPersistence(EtcdClient* etcd, const std::string& key,
                                            const etcdserverpb::Compare& fence);

}  // namespace loom::coordinator::ha
