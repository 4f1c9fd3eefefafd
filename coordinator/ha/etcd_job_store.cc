#include "coordinator/ha/etcd_job_store.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/ha/etcd_target.h"

namespace loom::coordinator::ha {
namespace {

// etcd's defaults: at most 128 operations per transaction (one of ours is
// the fence) and 1.5 MiB per request.
constexpr size_t kMaxOpsPerTxn = 100;
constexpr size_t kMaxBytesPerTxn = 1 << 20;

}  // namespace

EtcdJobStore::EtcdJobStore(EtcdClient* etcd, std::string prefix, etcdserverpb::Compare fence)
    : etcd_(etcd),
      jobs_prefix_(absl::StrCat(prefix, "/jobs/")),
      max_seq_key_(absl::StrCat(prefix, "/meta/max_seq")),
      fence_(std::move(fence)) {}

absl::Status EtcdJobStore::Commit(std::vector<etcdserverpb::RequestOp> ops,
                                  const std::string& what) {
  size_t next = 0;
  while (next < ops.size()) {
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = fence_;
    size_t bytes = 0;
    // At least one op per transaction; a single op over the byte budget is
    // sent alone (etcd refuses it if it is over its own limit).
    while (next < ops.size() && txn.success_size() < static_cast<int>(kMaxOpsPerTxn) &&
           (txn.success_size() == 0 || bytes + ops[next].ByteSizeLong() <= kMaxBytesPerTxn)) {
      bytes += ops[next].ByteSizeLong();
      *txn.add_success() = std::move(ops[next++]);
    }
    absl::StatusOr<etcdserverpb::TxnResponse> result = etcd_->Txn(txn);
    if (!result.ok()) {
      return absl::UnavailableError(absl::StrCat("job store: ", what, ": ", result.status().message()));
    }
    if (!result->succeeded()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job store: ", what, ": refused, this coordinator no longer leads (leader key ",
          fence_.key(), " is not the one created at revision ", fence_.create_revision(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status EtcdJobStore::Put(const loom::v1::Job& job) { return PutAll({&job}); }

absl::Status EtcdJobStore::PutAll(const std::vector<const loom::v1::Job*>& jobs) {
  if (jobs.empty()) return absl::OkStatus();
  std::vector<etcdserverpb::RequestOp> ops;
  ops.reserve(jobs.size());
  for (const loom::v1::Job* job : jobs) {
    etcdserverpb::PutRequest* put = ops.emplace_back().mutable_request_put();
    put->set_key(JobKey(job->id()));
    put->set_value(job->SerializeAsString());
  }
  return Commit(std::move(ops), absl::StrCat("store job ", jobs.front()->id()));
}

absl::StatusOr<std::vector<loom::v1::Job>> EtcdJobStore::LoadAll() {
  etcdserverpb::RangeRequest request;
  request.set_key(jobs_prefix_);
  request.set_range_end(PrefixRangeEnd(jobs_prefix_));
  absl::StatusOr<etcdserverpb::RangeResponse> response = etcd_->Range(request);
  if (!response.ok()) {
    return absl::UnavailableError(absl::StrCat("job store: read jobs: ", response.status().message()));
  }
  std::vector<loom::v1::Job> jobs;
  jobs.reserve(response->kvs_size());
  for (const etcdserverpb::KeyValue& kv : response->kvs()) {
    loom::v1::Job job;
    if (!job.ParseFromString(kv.value())) {
      return absl::DataLossError(absl::StrCat("job store: etcd key ", kv.key(),
                                              " holds an unreadable job record"));
    }
    jobs.push_back(std::move(job));
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const loom::v1::Job& a, const loom::v1::Job& b) {
    return JobIdSequence(a.id()) < JobIdSequence(b.id());
  });
  return jobs;
}

absl::Status EtcdJobStore::Delete(const std::vector<std::string>& ids) {
  if (ids.empty()) return absl::OkStatus();
  // The deleted ids' sequence numbers stay counted, so they are never given again.
  absl::StatusOr<int64_t> max = MaxSequence();
  if (!max.ok()) return max.status();
  std::vector<etcdserverpb::RequestOp> ops;
  etcdserverpb::PutRequest* put = ops.emplace_back().mutable_request_put();
  put->set_key(max_seq_key_);
  put->set_value(absl::StrCat(*max));
  for (const std::string& id : ids) {
    ops.emplace_back().mutable_request_delete_range()->set_key(JobKey(id));
  }
  return Commit(std::move(ops), absl::StrCat("delete job ", ids.front()));
}

absl::StatusOr<int64_t> EtcdJobStore::MaxSequence() {
  int64_t max = 0;
  absl::StatusOr<etcdserverpb::KeyValue> meta = etcd_->Get(max_seq_key_);
  if (meta.ok()) {
    if (!absl::SimpleAtoi(meta->value(), &max)) {
      return absl::DataLossError(absl::StrCat("job store: etcd key ", max_seq_key_,
                                              " is not a number"));
    }
  } else if (!absl::IsNotFound(meta.status())) {
    return meta.status();
  }
  etcdserverpb::RangeRequest request;
  request.set_key(jobs_prefix_);
  request.set_range_end(PrefixRangeEnd(jobs_prefix_));
  request.set_keys_only(true);
  absl::StatusOr<etcdserverpb::RangeResponse> keys = etcd_->Range(request);
  if (!keys.ok()) return keys.status();
  for (const etcdserverpb::KeyValue& kv : keys->kvs()) {
    max = std::max(max, JobIdSequence(kv.key()));
  }
  return max;
}

}  // namespace loom::coordinator::ha
