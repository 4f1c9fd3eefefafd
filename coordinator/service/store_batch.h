// RankService.StoreBatch without gRPC: the batch's bounds, then each op
// admitted on its own (as a single StoreSet / StoreAdd carrying its rank
// token would be) and applied to the store; an op that is refused or fails
// fails alone, in its own result.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/auth/identity.h"
#include "coordinator/rendezvous/kv_store.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

// Who the caller is with `token`, and whether it may call `method` (the full
// name of the single call the op stands for): CallerAuth::AdmitWithToken.
using AdmitOp = std::function<absl::StatusOr<auth::Identity>(const std::string& token,
                                                             const std::string& method)>;

// INVALID_ARGUMENT naming the bound when the batch has more ops or bytes
// than rpc::kMaxStoreBatchOps / rpc::kMaxStoreBatchBytes.
absl::Status CheckStoreBatch(const loom::v1::StoreBatchRequest& request);

// A rank entry (common/rpc/rank_entries.h) is written by its own rank only:
// PERMISSION_DENIED naming the key for any other caller (a carried entry must
// be what its rank published), INVALID_ARGUMENT for a key under the entries'
// prefix that names no rank. Other keys: OK.
absl::Status CheckEntryWriter(const auth::Identity& caller, const std::string& key);

// One result per op, in op order. Quick: the store's Set and Add do not wait.
void ApplyStoreBatch(const loom::v1::StoreBatchRequest& request, const AdmitOp& admit,
                     KvStore* kv, loom::v1::StoreBatchResponse* response);

}  // namespace loom::coordinator
