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
      steps_prefix_(absl::StrCat(prefix, "/steps/")),
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
      return FencedError(absl::StrCat(
          "job store: ", what, ": refused, this coordinator no longer leads (leader key ",
          fence_.key(), " is not the one created at revision ", fence_.create_revision(), ")"));
    }
  }
  return absl::OkStatus();
}

std::string EtcdJobStore::ChunkKey(const std::string& id, int64_t index) const {
  // Ten digits: the keys of a job's chunks sort as their numbers do.
  return absl::StrCat(StepsPrefix(id), absl::Dec(index, absl::kZeroPad10));
}

absl::Status EtcdJobStore::Write(const JobWrite& write) {
  std::vector<etcdserverpb::RequestOp> ops;
  ops.reserve(write.jobs.size() + write.step_chunks.size() + write.keep_chunks_from.size());
  for (const loom::v1::Job* job : write.jobs) {
    etcdserverpb::PutRequest* put = ops.emplace_back().mutable_request_put();
    put->set_key(JobKey(job->id()));
    put->set_value(job->SerializeAsString());
  }
  for (const StepChunk& chunk : write.step_chunks) {
    etcdserverpb::PutRequest* put = ops.emplace_back().mutable_request_put();
    put->set_key(ChunkKey(chunk.job_id, chunk.index));
    put->set_value(chunk.steps.SerializeAsString());
  }
  for (const auto& [id, below] : write.keep_chunks_from) {
    if (below <= 0) continue;
    etcdserverpb::DeleteRangeRequest* drop = ops.emplace_back().mutable_request_delete_range();
    drop->set_key(StepsPrefix(id));
    drop->set_range_end(ChunkKey(id, below));
  }
  if (ops.empty()) return absl::OkStatus();
  return Commit(std::move(ops), write.jobs.empty() ? std::string("store steps")
                                                    : absl::StrCat("store job ", write.jobs.front()->id()));
}

absl::StatusOr<std::map<std::string, StoredSteps>> EtcdJobStore::LoadSteps() {
  etcdserverpb::RangeRequest request;
  request.set_key(steps_prefix_);
  request.set_range_end(PrefixRangeEnd(steps_prefix_));
  absl::StatusOr<etcdserverpb::RangeResponse> response = etcd_->Range(request);
  if (!response.ok()) {
    return absl::UnavailableError(absl::StrCat("job store: read steps: ", response.status().message()));
  }
  // Keys come sorted: by job, then by chunk.
  std::map<std::string, StoredSteps> steps;
  for (const etcdserverpb::KeyValue& kv : response->kvs()) {
    const std::string rest = kv.key().substr(steps_prefix_.size());
    const size_t slash = rest.find('/');
    const std::string id = rest.substr(0, slash);
    int64_t index = 0;
    loom::v1::JobSteps chunk;
    if (slash == std::string::npos || !absl::SimpleAtoi(rest.substr(slash + 1), &index) ||
        !chunk.ParseFromString(kv.value())) {
      return absl::DataLossError(absl::StrCat("job store: etcd key ", kv.key(),
                                              " holds unreadable steps"));
    }
    auto [it, first] = steps.try_emplace(id);
    if (first) it->second.first = index * kStepsPerChunk;
    for (loom::v1::JobProgress& step : *chunk.mutable_steps()) {
      it->second.steps.push_back(std::move(step));
    }
  }
  return steps;
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
    etcdserverpb::DeleteRangeRequest* steps = ops.emplace_back().mutable_request_delete_range();
    steps->set_key(StepsPrefix(id));
    steps->set_range_end(PrefixRangeEnd(StepsPrefix(id)));
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
