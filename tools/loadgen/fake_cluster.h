// The simulated cluster of loom-loadgen: N fake node agents with G devices
// each, and every rank the coordinator launches on them, speaking the same
// protocol as loom-worker and loom-trainer over real gRPC (one TLS channel per
// node, with its own node certificate; ranks add their rank token):
//   node:  NodeService.Session: RegisterNode, Registered, heartbeats with the
//          running ranks, LaunchRank, KillRanks, RankExited, and its ranks'
//          progress forwarded as the agent does: one NodeMessage.progress
//          (RankProgressBatch) a second with its ranks' step records, and
//          their "ready" reports within 50 ms of their rendezvous.
//   rank:  StoreSet of its address, StoreAdd on a join counter (the last
//          joiner sets the "go" key: a barrier like Gloo's), each with its
//          rank token, in its node's StoreBatch calls as its agent relays a
//          trainer's (one batch in flight per node, the rest queued for the
//          next); then its reports go through its node.
//   node:  as the agent shares its ranks' waiting gets of one key, ONE
//          StoreGet of "go" per attempt for all its ranks, fanned out to them.
// Everything is asynchronous (gRPC's callback API), so 2,048 sessions need no
// thread each; the Tick functions are called by two driver threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tools/loadgen/latency.h"
#include "tools/loadgen/node_certs.h"

namespace loom::loadgen {

struct ClusterOptions {
  std::string coordinator;  // HOST:PORT
  int nodes = 8;
  int gpus_per_node = 8;
  std::string node_prefix = "lg";  // node ids are <prefix>-<index>
  bool insecure = false;           // plaintext (a coordinator started with --insecure)
  // Each rank starts its rendezvous at a uniformly random moment this long
  // after its launch (on the 1 Hz tick); 0: at once, all in one burst.
  double rank_start_spread_s = 0;
};

// Counters every callback updates; read by the driver for its report.
struct ClusterStats {
  std::atomic<int64_t> sessions_registered{0};
  std::atomic<int64_t> sessions_ended{0};  // a session stream ended before shutdown
  std::atomic<int64_t> launches{0};
  std::atomic<int64_t> kills{0};
  std::atomic<int64_t> ranks_ready{0};
  // Reports and batches gRPC took (a batch carries one node's reports).
  std::atomic<int64_t> reports_sent{0};
  std::atomic<int64_t> batches_sent{0};
  // A node's second skipped because its previous batch was still queued or
  // being written (loadgen or the coordinator lagging): its reports and it.
  std::atomic<int64_t> reports_skipped{0};
  std::atomic<int64_t> batches_skipped{0};
  std::atomic<int64_t> rendezvous_failed{0};
  // Each set and add, timed as the StoreBatch that carried it.
  LatencyRecorder store_latency;
  std::atomic<int64_t> store_batches{0};  // StoreBatch calls sent
  // From queueing a heartbeat to gRPC taking it: when this nears the node
  // timeout, loadgen itself (not the coordinator) is what lags.
  LatencyRecorder heartbeat_delay;
  // How late each slice of the heartbeat schedule ran (loadgen's own lag).
  LatencyRecorder heartbeat_tick_lateness;
};

class FakeNode;

class FakeCluster {
 public:
  FakeCluster(ClusterOptions options, NodeCertFactory* certs);
  ~FakeCluster();

  // Issues the certificates and creates the nodes (Tick may run from now on).
  absl::Status Create();
  // Opens every session and waits (up to timeout) until every node is registered.
  absl::Status Connect(absl::Duration timeout);

  // One step of the 1 Hz schedules: call each every tick_interval with slice
  // 0..slices-1 in turn; they serve the nodes whose index % slices == slice,
  // spreading a second's messages evenly instead of sending them in one
  // burst. Heartbeats and progress batches have schedules (threads) of their
  // own, as an agent's heartbeat does not wait for its ranks: when loadgen is
  // short of CPU, the 2,048 batches a second fall behind, not the 2,048
  // heartbeats. TickReports also sends, for every node, the "ready" reports
  // of ranks whose rendezvous ended since the last tick (an agent's batch
  // window merges a node's ranks, which leave the barrier together).
  void TickHeartbeats(int slice, int slices);
  void TickReports(int slice, int slices);

  // From now on the given rank sends nothing and every other rank stops
  // completing steps (they wait in a data-parallel all-reduce for it), as
  // when one process of a real job is SIGSTOPped.
  void StopRank(int rank);

  // Cancels every stream and waits (bounded) until gRPC has let go of them.
  void Shutdown();

  ClusterStats& stats() { return stats_; }
  const ClusterOptions& options() const { return options_; }

  // Shared by the nodes and ranks (read-only after Start).
  struct Shared {
    ClusterStats* stats;
    double rank_start_spread_s = 0;
    std::atomic<int> stopped_rank{-1};
    std::atomic<int64_t> stopped_at_ms{0};
    std::atomic<bool> shutting_down{false};
  };

 private:
  const ClusterOptions options_;
  NodeCertFactory* const certs_;
  ClusterStats stats_;
  Shared shared_;
  std::vector<std::unique_ptr<FakeNode>> nodes_;
};

}  // namespace loom::loadgen
