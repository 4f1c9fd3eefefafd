#include "tools/loadgen/node_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/store_quotas.h"

namespace loom::loadgen {

void NodeGets::Wait(const std::string& store_namespace, const std::string& key,
                    const std::string& token, Done done) {
  Call* call = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;  // the node is gone: nothing leaves it
    Shared& get = gets_[{store_namespace, key}];
    get.waiters.push_back(std::move(done));
    if (get.call != nullptr) return;  // one is in flight: this rank shares it
    call = new Call;
    call->context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(600)));
    call->request.set_store_namespace(store_namespace);
    call->request.set_key(key);
    call->request.set_wait_ms(590'000);
    get.call = call;
  }
  stats_->store_gets++;
  stub_->async()->StoreGet(&call->context, &call->request, &call->response,
                           [this, id = Id{store_namespace, key}, call](grpc::Status status) {
                             Ended(id, call, status);
                           });
}

void NodeGets::Ended(const Id& id, Call* call, const grpc::Status& status) {
  std::vector<Done> waiters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = gets_.find(id);
    if (it != gets_.end() && it->second.call == call) {
      waiters.swap(it->second.waiters);
      gets_.erase(it);
    }
  }
  for (Done& done : waiters) done(status);
  delete call;
}

void NodeGets::CancelExcept(const std::set<std::string>* keep) {
  std::lock_guard<std::mutex> lock(mu_);
  if (keep == nullptr) stopped_ = true;
  for (auto& [id, get] : gets_) {
    if (get.call != nullptr && (keep == nullptr || keep->count(id.first) == 0)) {
      get.call->context.TryCancel();
    }
  }
}

void NodeWrites::Send(loom::v1::StoreOp op, Done done) {
  Batch* batch = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;  // the node is gone: nothing leaves it
    queue_.emplace_back(std::move(op), std::move(done));
    if (busy_) return;  // goes with the next batch
    busy_ = true;
    batch = TakeLocked();
  }
  Issue(batch);
}

NodeWrites::Batch* NodeWrites::TakeLocked() {
  if (queue_.empty()) return nullptr;
  auto* batch = new Batch;
  const size_t n = std::min<size_t>(queue_.size(), rpc::kMaxStoreBatchOps);
  for (size_t i = 0; i < n; ++i) {
    *batch->request.add_ops() = std::move(queue_[i].first);
    batch->done.push_back(std::move(queue_[i].second));
  }
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  return batch;
}

void NodeWrites::Issue(Batch* batch) {
  batch->start = absl::Now();
  stats_->store_batches++;
  stats_->store_ops += batch->request.ops_size();
  batch->context.set_deadline(absl::ToChronoTime(batch->start + absl::Seconds(30)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ = batch;
  }
  stub_->async()->StoreBatch(&batch->context, &batch->request, &batch->response,
                             [this, batch](grpc::Status status) { Ended(batch, status); });
}

void NodeWrites::Ended(Batch* batch, const grpc::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ = nullptr;
  }
  // Each op is timed as the batch that carried it.
  const absl::Duration took = absl::Now() - batch->start;
  const bool whole = status.ok() && batch->response.results_size() == batch->request.ops_size();
  for (size_t i = 0; i < batch->done.size(); ++i) {
    grpc::Status op_status = status;
    int64_t value = 0;
    if (whole) {
      const loom::v1::StoreOpResult& r = batch->response.results(static_cast<int>(i));
      op_status = grpc::Status(static_cast<grpc::StatusCode>(r.code()), r.message());
      value = r.value();
    } else if (status.ok()) {
      op_status = grpc::Status(grpc::StatusCode::INTERNAL, "StoreBatch answered the wrong count");
    }
    if (!shutting_down_->load()) {
      if (op_status.ok()) {
        stats_->store_latency.Record(took);
      } else {
        stats_->store_latency.RecordFailure();
      }
    }
    batch->done[i](op_status, value);  // may queue the rank's next op
  }
  delete batch;
  Batch* next = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next = shutting_down_->load() || stopped_ ? nullptr : TakeLocked();
    busy_ = next != nullptr;
    if (next == nullptr) queue_.clear();  // shutting down, or nothing left
  }
  if (next != nullptr) Issue(next);
}

void NodeWrites::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  if (in_flight_ != nullptr) in_flight_->context.TryCancel();
}

}  // namespace loom::loadgen
