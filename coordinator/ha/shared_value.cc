#include "coordinator/ha/shared_value.h"

#include "absl/strings/str_cat.h"

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

}  // namespace loom::coordinator::ha
