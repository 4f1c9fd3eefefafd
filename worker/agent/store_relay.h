// The rendezvous store calls of this agent's ranks (AgentService.Store*),
// relayed to the coordinator's RankService on the agent's own channel (the
// one its node session uses, so calls follow the leader of an HA cluster),
// each with the calling rank's token. Everything is asynchronous: upstream
// calls use the callback stub, and retries and waiters' deadlines run on one
// small timer thread, so no thread is held by a waiting call.
//  - Concurrent gets of one (namespace, key) share one upstream call, which
//    waits as long as the longest waiter; a waiter whose own deadline passes
//    gets DEADLINE_EXCEEDED, and waiters left when the upstream call ends
//    without a value are served by a new one.
//  - Sets and adds go up in RankService.StoreBatch calls (each op with its
//    rank's token and its own result), coalesced adaptively: with no batch
//    in flight a call goes at once, as a batch of one; while one is in
//    flight later calls queue and go together when it returns (at most
//    rpc::kMaxStoreBatchOps ops and kMaxStoreBatchBytes). The launch burst
//    of a node's ranks thus costs a few upstream calls, not one per call.
//  - Set and Get are retried through UNAVAILABLE (a coordinator restarting or
//    failing over) until their deadline, with backoff; Add never is (an add
//    that reached the coordinator must not be applied twice). When a whole
//    batch fails with UNAVAILABLE its sets are queued again, its adds fail.
//  - What the agent holds is bounded: pending calls per rank and in all
//    (RESOURCE_EXHAUSTED naming the bound), and the request sizes the
//    coordinator's store accepts (common/rpc/store_quotas.h).
//  - Fenced by the agent's lease (lease.h): a paused rank's call is refused
//    (UNAVAILABLE), and a call admitted before the lease ran out is never
//    sent upstream after that (also not when the lease runs again by then):
//    it fails with UNAVAILABLE when its batch or get would go.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc/coordinator_channel.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/rank.pb.h"
#include "worker/agent/lease.h"
#include "worker/agent/rank_tokens.h"

namespace loom::agent {

struct StoreRelayOptions {
  int max_pending_per_rank = 64;  // store calls of one rank held at once
  int max_pending = 16384;        // all ranks together
  // How long a set is retried through UNAVAILABLE (as the trainer did).
  absl::Duration set_retry_for = absl::Seconds(30);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // The deadline of one upstream StoreBatch.
  absl::Duration unary_deadline = absl::Seconds(10);
  // An upstream get's call deadline beyond its wait_ms: the round trip.
  absl::Duration get_slack = absl::Seconds(1);
};

// OK, or why the agent refuses a store call of `rank` before relaying it:
// UNAVAILABLE while the rank is paused (CheckNotPaused), PERMISSION_DENIED
// when the namespace is not the rank's own, and INVALID_ARGUMENT for an
// empty namespace or key or a key larger than the coordinator's store
// accepts, RESOURCE_EXHAUSTED for a value larger than its default quota
// (rpc::StoreQuotas, as the coordinator answers).
absl::Status CheckStoreCall(const RankIdentity& rank, const std::string& store_namespace,
                            const std::string& key, size_t value_bytes);

class StoreRelay {
 public:
  using SetDone = std::function<void(grpc::Status)>;
  using GetDone = std::function<void(grpc::Status, const std::string& value)>;
  using AddDone = std::function<void(grpc::Status, int64_t value)>;

  // lease: the agent's (outlives the relay); null: never fenced.
  StoreRelay(std::shared_ptr<rpc::CoordinatorChannel> coordinators, StoreRelayOptions options = {},
             Lease* lease = nullptr);
  ~StoreRelay();  // Shutdown()
  StoreRelay(const StoreRelay&) = delete;
  StoreRelay& operator=(const StoreRelay&) = delete;

  // Each calls its done exactly once, possibly before returning (a refused
  // call) or on a gRPC or timer thread; done must be quick.
  void Set(const RankIdentity& rank, const std::string& token,
           const loom::v1::StoreSetRequest& request, SetDone done);
  // Waits for the key until `deadline` (the caller's wait_ms and deadline).
  void Get(const RankIdentity& rank, const std::string& token,
           const loom::v1::StoreGetRequest& request, absl::Time deadline, GetDone done);
  void Add(const RankIdentity& rank, const std::string& token,
           const loom::v1::StoreAddRequest& request, AddDone done);

  // Cancels what is in flight and answers every pending call (UNAVAILABLE:
  // the agent is stopping); later calls are refused the same way. Call it
  // before shutting down the server whose calls it answers.
  void Shutdown();

  // Upstream calls made so far, and the ranks' calls held now (for tests
  // and metrics).
  int64_t upstream_calls() const;
  int pending() const;

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace loom::agent
