#include "coordinator/service/store_batch.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/rank_entries.h"
#include "common/rpc/store_quotas.h"
#include "coordinator/auth/policy.h"

namespace loom::coordinator {
namespace {

void SetResult(const absl::Status& status, loom::v1::StoreOpResult* result) {
  result->set_code(static_cast<int32_t>(status.code()));
  result->set_message(std::string(status.message()));
}

// The namespace and key of a set or add, checked as the single calls check them.
absl::Status Admitted(const AdmitOp& admit, const std::string& token, const std::string& method,
                      const std::string& ns, const std::string& key) {
  absl::StatusOr<auth::Identity> caller = admit(token, method);
  if (!caller.ok()) return caller.status();
  if (absl::Status s = auth::AuthorizeStore(*caller, ns); !s.ok()) return s;
  if (ns.empty() || key.empty()) {
    return absl::InvalidArgumentError("store_namespace and key must both be set");
  }
  return CheckEntryWriter(*caller, key);
}

}  // namespace

absl::Status CheckEntryWriter(const auth::Identity& caller, const std::string& key) {
  if (key.compare(0, rpc::kRankEntryPrefix.size(), rpc::kRankEntryPrefix) != 0) {
    return absl::OkStatus();
  }
  const std::optional<int32_t> rank = rpc::RankOfEntry(key);
  if (!rank.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key ", key, " is under ", std::string(rpc::kRankEntryPrefix), " but is not a rank entry (",
        std::string(rpc::kRankEntryPrefix), "<rank>/<name>)"));
  }
  if (caller.role == auth::Role::kInsecure) return absl::OkStatus();
  if (!caller.rank.has_value() || caller.rank->rank != *rank) {
    return absl::PermissionDeniedError(absl::StrCat(
        "key ", key, " is rank ", *rank, "'s entry; only that rank may write it"));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreBatch(const loom::v1::StoreBatchRequest& request) {
  if (request.ops_size() > rpc::kMaxStoreBatchOps) {
    return absl::InvalidArgumentError(absl::StrCat("StoreBatchRequest.ops has ", request.ops_size(),
                                                   " ops; a batch carries at most ",
                                                   rpc::kMaxStoreBatchOps));
  }
  int64_t bytes = 0;
  for (const loom::v1::StoreOp& op : request.ops()) {
    bytes += static_cast<int64_t>(op.set().key().size() + op.set().value().size() +
                                  op.add().key().size());
  }
  if (bytes > rpc::kMaxStoreBatchBytes) {
    return absl::InvalidArgumentError(absl::StrCat("StoreBatchRequest.ops hold ", bytes,
                                                   " bytes of keys and values; a batch carries at most ",
                                                   rpc::kMaxStoreBatchBytes));
  }
  return absl::OkStatus();
}

void ApplyStoreBatch(const loom::v1::StoreBatchRequest& request, const AdmitOp& admit,
                     KvStore* kv, loom::v1::StoreBatchResponse* response) {
  response->mutable_results()->Reserve(request.ops_size());
  for (const loom::v1::StoreOp& op : request.ops()) {
    loom::v1::StoreOpResult* result = response->add_results();
    if (op.has_set()) {
      const loom::v1::StoreSetRequest& set = op.set();
      absl::Status status = Admitted(admit, op.rank_token(), "/loom.v1.RankService/StoreSet",
                                     set.store_namespace(), set.key());
      if (status.ok()) status = kv->Set(set.store_namespace(), set.key(), set.value());
      SetResult(status, result);
    } else if (op.has_add()) {
      const loom::v1::StoreAddRequest& add = op.add();
      absl::Status status = Admitted(admit, op.rank_token(), "/loom.v1.RankService/StoreAdd",
                                     add.store_namespace(), add.key());
      if (status.ok()) {
        absl::StatusOr<int64_t> value = kv->Add(add.store_namespace(), add.key(), add.delta());
        if (value.ok()) result->set_value(*value);
        status = value.status();
      }
      SetResult(status, result);
    } else {
      SetResult(absl::InvalidArgumentError("StoreOp.op must be a set or an add"), result);
    }
  }
}

}  // namespace loom::coordinator
