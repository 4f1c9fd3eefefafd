// The simulated cluster of loom-loadgen: N fake node agents with G devices
// each (fake_node.h), and every rank the coordinator launches on them
// (rank_life.h), speaking the same protocol as loom-worker and loom-trainer
// over real gRPC (one TLS channel per node, with its own node certificate;
// ranks add their rank token):
//   node:  NodeService.Session: RegisterNode, heartbeats with the running
//          ranks, the lease (Registered.lease_ms, HeartbeatAck), LaunchRank,
//          KillRanks, AbortRanks, EnterEpoch, ResumeRanks, RankExited, and
//          its ranks' progress forwarded as the agent does: one
//          NodeMessage.progress (RankProgressBatch) a second with its ranks'
//          reports, and their events (ready and resumed, aborted, the first
//          step of an attempt) within 50 ms.
//   rank:  per attempt, StoreSet of its address, StoreAdd on a join counter
//          (the last joiner sets the "go" key: a barrier like Gloo's), each
//          with its rank token in its node's StoreBatch calls; the node's ONE
//          StoreGet of "go" for all its waiting ranks.
// The job's steps come from one clock (job_clock.h): a synchronous job.
// Faults: a rank stopped (a hang), crashed (RankExited), or its whole node
// lost (the session ends, its ranks with it).
// Everything is asynchronous (gRPC's callback API), so 2,048 sessions need no
// thread each; the Tick functions are called by two driver threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/loadgen/cluster_stats.h"
#include "tools/loadgen/fake_node.h"
#include "tools/loadgen/job_clock.h"
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
  // The simulated job's step time.
  absl::Duration step = absl::Seconds(1);
};

class FakeCluster {
 public:
  // certs: null with options.insecure.
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
  // heartbeats. TickReports also sends, for every node, its ranks' events
  // since the last tick (ready and resumed, aborted, an attempt's first
  // step): an agent's batch window merges a node's ranks, which act together.
  void TickHeartbeats(int slice, int slices);
  void TickReports(int slice, int slices);

  // Faults. Each freezes the job's clock: every other rank waits in the
  // all-reduce of the next step.
  // The rank sends nothing from now on (SIGSTOPped).
  absl::Status StopRank(int rank);
  // The rank's process dies (SIGKILL): its node reports RankExited.
  absl::Status CrashRank(int rank);
  // The node running the rank dies with all its ranks: its session ends and
  // it never comes back.
  struct LostNode {
    std::string id;
    std::vector<int32_t> ranks;  // the ranks that died with it
  };
  absl::StatusOr<LostNode> LoseNodeOf(int rank);

  // The job's steps and its attempts' milestones now.
  JobClock::View Clock() const { return clock_.At(absl::Now()); }
  // Live ranks of `job_id` in an attempt older than the clock's.
  int RanksBehind(const std::string& job_id) const;

  // Cancels every stream and waits (bounded) until gRPC has let go of them.
  void Shutdown();

  ClusterStats& stats() { return stats_; }
  const ClusterOptions& options() const { return options_; }

 private:
  FakeNode* NodeRunning(int rank) const;

  const ClusterOptions options_;
  NodeCertFactory* const certs_;
  ClusterStats stats_;
  JobClock clock_;
  NodeShared shared_;
  std::vector<std::unique_ptr<FakeNode>> nodes_;
};

}  // namespace loom::loadgen
