// One fake node agent of loom-loadgen: its NodeService.Session, carried out as
// loom-worker carries it out (docs/agent.md), for ranks that are RankLife
// state machines instead of processes:
//   up:    RegisterNode; a heartbeat a second with its running ranks (current
//          attempt, paused by the lease); RankExited (kills, crashes, ranks
//          that could not restore or gave up waiting); its ranks' progress in
//          one RankProgressBatch per second, and their events (ready and
//          resumed, aborted, the first step of an attempt) within 50 ms.
//   down:  Registered (starts the lease), HeartbeatAck (extends it),
//          LaunchRank, KillRanks (by attempt and ranks), AbortRanks,
//          EnterEpoch (per rank: new token, namespace, ring; a new
//          rendezvous), ResumeRanks.
//   store: its ranks' rendezvous through NodeWrites and NodeGets.
// The lease is the agent's own class (worker/agent/lease.h): when it runs
// out, every rank launched or resumed before stops (sends nothing, reported
// paused) until ResumeRanks names it or KillRanks kills it.
//
// Its writes go one at a time (gRPC allows one in flight), in this order: the
// heartbeat, then exits (outbox_), then the progress batch; the heartbeat and
// the batch are reused messages, each queued at most once.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/node.grpc.pb.h"
#include "loom/v1/rank.grpc.pb.h"
#include "tools/loadgen/cluster_stats.h"
#include "tools/loadgen/job_clock.h"
#include "tools/loadgen/node_store.h"
#include "tools/loadgen/rank_life.h"
#include "worker/agent/lease.h"

namespace loom::loadgen {

// What every node shares; owned by the cluster.
struct NodeShared {
  ClusterStats* stats = nullptr;
  JobClock* clock = nullptr;
  // Each rank starts its rendezvous at a uniformly random moment this long
  // after its launch (on the report tick); 0: at once.
  double rank_start_spread_s = 0;
  std::atomic<bool> shutting_down{false};
  std::atomic<int32_t> next_pid{100000};  // the simulated processes' ids
};

class FakeNode final
    : public grpc::ClientBidiReactor<loom::v1::NodeMessage, loom::v1::CoordinatorMessage> {
 public:
  FakeNode(std::string id, int gpus, std::shared_ptr<grpc::Channel> channel, NodeShared* shared);

  const std::string& id() const { return id_; }
  // Opens the session and sends RegisterNode.
  void Start();
  bool registered() const;

  // The 1 Hz heartbeat (the heartbeat thread). It also looks at the lease,
  // and at ranks that have waited for their next attempt too long.
  void Heartbeat();
  // Whether a batch of events is due (the report thread, every 50 ms):
  // ready/resumed or aborted reports waiting, or, with first_step_due (the
  // clock completed the current attempt's first step), first step reports.
  bool EventsPending(bool first_step_due) const;
  // Sends this node's progress batch: with full (its 1 Hz tick) a report per
  // running rank plus any events; without, the events only. A full batch
  // due while the previous one is still queued is skipped and counted.
  void SendBatch(bool full, absl::Time now, const JobClock::View& clock);

  // Faults, as the load generator injects them.
  bool Runs(int rank) const;
  // The ranks alive here now.
  std::vector<int32_t> LiveRanks() const;
  // The rank's process dies (SIGKILL): RankExited{signal 9}.
  bool CrashRank(int rank);
  // The rank's process stops (SIGSTOP): it sends and answers nothing.
  bool SilenceRank(int rank);
  // The agent and its ranks die: the session ends (no RankExited), nothing
  // more leaves the node, and it never registers again.
  void Lose();
  // Live ranks of `job_id` in an attempt older than `attempt` (survivors left
  // behind by a recovery).
  int RanksBehind(const std::string& job_id, int32_t attempt) const;

  // Shutdown: cancels the session and the store calls.
  void Cancel();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // Queues a message behind the write in flight (exits, a spare heartbeat).
  void Send(loom::v1::NodeMessage message);
  void Launch(const loom::v1::RankAssignment& assignment);
  void Kill(const loom::v1::KillRanks& kill);
  void Abort(const loom::v1::AbortRanks& abort);
  void EnterEpoch(const loom::v1::EnterEpoch& epoch);
  void Resume(const loom::v1::ResumeRanks& resume);
  // A rank's exit in `attempt` as the agent reports it (builds, does not send).
  static loom::v1::NodeMessage ExitMessage(const RankLife& rank, int32_t attempt, int exit_code,
                                           int signal, const std::string& why);

  // The rendezvous of one attempt, each step after the last one's answer; a
  // step whose rank left that attempt (or died) meanwhile ends it.
  void BeginRendezvous(RankLife* rank);
  void Join(RankLife* rank, int32_t attempt);
  void Release(RankLife* rank, int32_t attempt);
  void WaitForGo(RankLife* rank, int32_t attempt);
  void PassedBarrier(RankLife* rank, int32_t attempt);
  void RendezvousFailed(RankLife* rank, int32_t attempt, const std::string& what,
                        const grpc::Status& status);
  bool JoiningLocked(const RankLife* rank, int32_t attempt) const;
  bool PausedLocked(const RankLife& rank) const;
  // Cancels the shared gets no joining rank waits on any more (mu_ not held).
  void CancelAbandonedGets();
  void ReleaseHold();

  const std::string id_;
  const int gpus_;
  std::unique_ptr<loom::v1::NodeService::Stub> node_stub_;
  std::unique_ptr<loom::v1::RankService::Stub> rank_stub_;
  NodeShared* const shared_;
  NodeGets gets_;      // its ranks' shared waiting gets
  NodeWrites writes_;  // its ranks' sets and adds, in StoreBatch calls
  agent::Lease lease_;
  agent::Lease::TimePoint register_sent_;
  grpc::ClientContext context_;
  loom::v1::CoordinatorMessage in_;
  std::atomic<bool> events_pending_{false};
  std::atomic<bool> awaiting_first_step_{false};

  mutable std::mutex mu_;
  loom::v1::NodeMessage heartbeat_;  // the heartbeat, reused every second
  absl::Time heartbeat_queued_at_;   // for the heartbeat delay
  bool heartbeat_busy_ = false;      // heartbeat_ queued or being written
  bool heartbeat_queued_ = false;    // heartbeat_ waits for the write in flight
  loom::v1::NodeMessage out_;        // the exit (or spare heartbeat) being written
  absl::Time out_queued_;            // when out_ was queued, for the heartbeat delay
  loom::v1::NodeMessage batch_;      // the progress batch, reused every second
  int batch_ready_ = 0;              // its "ready" reports
  bool batch_busy_ = false;          // batch_ queued or being written
  bool batch_queued_ = false;        // batch_ waits for the write in flight
  loom::v1::NodeMessage* in_flight_ = nullptr;
  std::deque<std::pair<loom::v1::NodeMessage, absl::Time>> outbox_;
  std::vector<std::unique_ptr<RankLife>> ranks_;
  // Ranks launched with a start spread, not yet begun, and when each begins.
  std::vector<std::pair<RankLife*, absl::Time>> to_start_;
  int32_t newest_attempt_ = 0;  // the newest attempt it was told of (one job)
  uint64_t expiries_seen_ = 0;  // lease run-outs already counted
  // Heartbeats not yet acknowledged: seq and when made (for ack_delay).
  std::deque<std::pair<int64_t, absl::Time>> unacked_;
  bool writing_ = false;
  bool registered_ = false;
  bool ended_ = false;
  bool lost_ = false;
  bool hold_released_ = false;
  int64_t seq_ = 0;
  std::mt19937 random_{std::random_device{}()};
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

}  // namespace loom::loadgen
