// A fake node's relay of its ranks' rendezvous store calls, as loom-worker
// relays its trainers' (worker/agent/store_relay.h), on the node's own
// channel with each rank's token:
//   NodeWrites: sets and adds in StoreBatch calls; with no batch in flight an
//     op goes at once, while one is, later ops queue and go together when it
//     returns (the follow-up ops its answers cause queue before the next
//     batch goes, so a node's ranks that act together share their batches).
//   NodeGets: ONE StoreGet per (namespace, key) for all of the node's ranks
//     that wait on it, answered to each of them.
// Asynchronous (gRPC's callback API); the callbacks run on gRPC's threads.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/rank.grpc.pb.h"
#include "tools/loadgen/cluster_stats.h"

namespace loom::loadgen {

class NodeGets {
 public:
  using Done = std::function<void(const grpc::Status&)>;
  NodeGets(loom::v1::RankService::Stub* stub, ClusterStats* stats,
           const std::atomic<bool>* shutting_down)
      : stub_(stub), stats_(stats), shutting_down_(shutting_down) {}

  // Waits for key in store_namespace (token: the waiting rank's); done runs
  // once the value is there or the shared call failed.
  void Wait(const std::string& store_namespace, const std::string& key, const std::string& token,
            Done done);
  // Cancels the shared gets of every namespace not in keep (nullptr: every
  // one, at shutdown or when the node is lost, and no get leaves the node
  // after that). Their waiters hear CANCELLED.
  void CancelExcept(const std::set<std::string>* keep);

 private:
  struct Call {
    grpc::ClientContext context;
    loom::v1::StoreGetRequest request;
    loom::v1::StoreGetResponse response;
  };
  struct Shared {
    Call* call = nullptr;
    std::vector<Done> waiters;
  };
  using Id = std::pair<std::string, std::string>;  // namespace, key
  void Ended(const Id& id, Call* call, const grpc::Status& status);

  loom::v1::RankService::Stub* const stub_;
  ClusterStats* const stats_;
  const std::atomic<bool>* const shutting_down_;
  std::mutex mu_;
  std::map<Id, Shared> gets_;
  bool stopped_ = false;
};

class NodeWrites {
 public:
  // done runs once with the op's status and, for an add, its value.
  using Done = std::function<void(const grpc::Status&, int64_t value)>;
  NodeWrites(loom::v1::RankService::Stub* stub, ClusterStats* stats,
             const std::atomic<bool>* shutting_down)
      : stub_(stub), stats_(stats), shutting_down_(shutting_down) {}

  void Send(loom::v1::StoreOp op, Done done);
  // Cancels the batch in flight and sends nothing more (shutdown, the node
  // lost): later ops are dropped unanswered.
  void CancelAll();

 private:
  struct Batch {
    grpc::ClientContext context;
    loom::v1::StoreBatchRequest request;
    loom::v1::StoreBatchResponse response;
    std::vector<Done> done;
    absl::Time start;
  };
  // Takes the queue as the next batch (mu_ held); nullptr when it is empty.
  Batch* TakeLocked();
  void Issue(Batch* batch);
  void Ended(Batch* batch, const grpc::Status& status);

  loom::v1::RankService::Stub* const stub_;
  ClusterStats* const stats_;
  const std::atomic<bool>* const shutting_down_;
  std::mutex mu_;
  std::vector<std::pair<loom::v1::StoreOp, Done>> queue_;
  Batch* in_flight_ = nullptr;
  bool busy_ = false;  // a batch is in flight or its answers are being handled
  bool stopped_ = false;
};

}  // namespace loom::loadgen
