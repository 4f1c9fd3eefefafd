#include "coordinator/ha/shared_value.h"

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/job_store.h"

namespace loom::coordinator::ha {

absl::StatusOr<std::string> LoadOrCreateShared(EtcdClient* etcd, const std::string& key,
                                               const std::function<std::string()>& make) {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* absent = txn.add_compare();
  absent->set_key(key);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(make());
  txn.add_failure()->mutable_request_range()->set_key(key);
  absl::StatusOr<etcdserverpb::TxnResponse> result = etcd->Txn(txn);
  if (!result.ok()) return result.status();
  if (result->succeeded()) return put->value();
  const etcdserverpb::RangeResponse& existing = result->responses(0).response_range();
  if (existing.kvs_size() == 0) {
    return absl::InternalError(absl::StrCat("etcd key ", key, " vanished while being read"));
  }
  return existing.kvs(0).value();
}

absl::Status FencedPut(EtcdClient* etcd, const etcdserverpb::Compare& fence,
                       const std::string& key, const std::string& value) {
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = fence;
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  absl::StatusOr<etcdserverpb::TxnResponse> result = etcd->Txn(txn);
  if (!result.ok()) return result.status();
  if (!result->succeeded()) {
    return FencedError(absl::StrCat("etcd key ", key, ": refused, this coordinator no longer leads"));
  }
  return absl::OkStatus();
}

auth::TokenPersistence EtcdTokenPersistence(EtcdClient* etcd, const std::string& key,
                                            const etcdserverpb::Compare& fence) {
  return {.name = absl::StrCat("etcd key ", key),
          .load = [etcd, key]() -> absl::StatusOr<std::string> {
            absl::StatusOr<etcdserverpb::KeyValue> kv = etcd->Get(key);
            if (absl::IsNotFound(kv.status())) return std::string();
            if (!kv.ok()) return kv.status();
            return kv->value();
          },
          .save = [etcd, key, fence](const std::string& text) {
            return FencedPut(etcd, fence, key, text);
          }};
}

}  // namespace loom::coordinator::ha
