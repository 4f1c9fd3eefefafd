// The agent's side of NodeService.Session: one long-lived bidirectional stream
// to the coordinator. Sends RegisterNode first (with the ranks still running,
// so a coordinator that restarted learns about them), then, once Registered
// arrives, heartbeats, rank exits and the ranks' progress (in batches: every
// report waits at most progress_batch_window, so the reports of one step go
// in one message); carries LaunchRank, KillRanks, AbortRanks, EnterEpoch and
// ResumeRanks down to the rank commands, answers ReadRankLog from a
// LogReadQueue (never on the stream's thread), and feeds the agent's lease
// (lease.h): Registered.lease_ms with the registration's send time, and each
// HeartbeatAck with its heartbeat's, and each ack of a liveness beat
// (liveness_beater.h, when Registered grants the path) with the beat's. When
// the stream fails it reconnects with
// exponential backoff and never touches the ranks: a coordinator restart
// kills nothing (one longer than the lease pauses them, through the lease).
// Given several coordinator addresses (a highly available cluster), each new
// stream goes to the one that leads (rpc::CoordinatorChannel).
#pragma once

#include <atomic>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "common/rpc/coordinator_channel.h"
#include "common/rpc/progress_batch.h"
#include "loom/v1/node.grpc.pb.h"
#include "worker/agent/lease.h"
#include "worker/agent/liveness_beater.h"
#include "worker/agent/log_read_queue.h"
#include "worker/agent/rank_commands.h"

namespace loom::agent {

struct NodeSessionOptions {
  std::string coordinator;  // HOST:PORT, or several comma-separated
  // From rpc::ChannelCredentials (mutual TLS, or plaintext only behind the
  // agent's --insecure). Required: the session never picks plaintext itself.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // When set, the session uses this channel (shared with the agent's store
  // relay, so both follow the same leader) instead of making its own from
  // coordinator and credentials.
  std::shared_ptr<rpc::CoordinatorChannel> coordinators;
  // Sent at the start of every stream; its `running` list is filled in then.
  loom::v1::RegisterNode registration;
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(5);
  // Used until Registered names one (and when it names 0).
  absl::Duration default_heartbeat = absl::Seconds(1);
  // Longest a progress report waits for others to share its message.
  absl::Duration progress_batch_window = absl::Milliseconds(100);
  // Progress reports held while no session is up (the oldest go first).
  size_t max_pending_progress = 65536;
  // ... and at most this many bytes of them.
  int64_t max_pending_progress_bytes = int64_t{64} << 20;
  // The agent's lease, fed by the session (outlives it); null: none.
  Lease* lease = nullptr;
  // Reads rank logs for ReadRankLog (RankManager::ReadLog), on the
  // LogReadQueue's thread; null: such requests are answered UNIMPLEMENTED.
  LogReadQueue::Reader read_log;
};

// How often a session without a coordinator tries to connect while its lease
// runs (AwaitChannelWhileLeased).
inline constexpr absl::Duration kLeaseReconnectPoll = absl::Milliseconds(200);

// Reports in one NodeMessage.progress, as the coordinator accepts them.
inline constexpr int kMaxProgressBatch = rpc::kMaxProgressBatchReports;

class NodeSession {
 public:
  using Clock = std::chrono::steady_clock;

  NodeSession(NodeSessionOptions options, RankCommands* ranks);
  ~NodeSession();

  // Connects, and reconnects, until Shutdown. Call from one thread.
  void Run();

  // Sends what is queued (if registered), half-closes the stream and makes
  // Run return; cancels the stream if that takes longer than flush_timeout.
  // Returns once Run has returned (at once if Run is not running).
  void Shutdown(absl::Duration flush_timeout = absl::Seconds(1));

  // Queues a RankExited; it is sent after registration on the current or the
  // next stream. At least once: an exit whose stream failed within a minute
  // of sending it is sent again on the next stream.
  void ReportExit(loom::v1::RankExited exited);

  // Queues a rank's progress report (already checked by AgentService); it
  // goes in the next batch, at most progress_batch_window from now when the
  // session is up. At least once: batches whose stream failed within the
  // resend window are sent again on the next stream (the coordinator ignores
  // reports older than what it holds).
  void ReportProgress(loom::v1::RankProgress progress);
  // Tells the coordinator this agent is shutting down (NodeMessage.Draining):
  // it drains the node, so the jobs stopping here go on elsewhere.
  void Drain(const std::string& reason);
  // Progress reports dropped because too many waited for a session.
  int64_t progress_dropped() const;

  // Streams opened and Registered messages received so far (for tests/logs).
  int64_t streams_opened() const;
  int64_t registrations() const;

 private:
  // Runs one stream until it fails or Shutdown; true when it got Registered.
  bool RunStream(rpc::CoordinatorChannel& coordinators);
  // While the lease runs, waits for the channel to connect, trying again
  // every kLeaseReconnectPoll rather than after the channel's backoff (up to
  // 2 s): a coordinator back within the lease must be reached before it runs
  // out. Returns at once without a lease, once it has run out, or stopping.
  void AwaitChannelWhileLeased(grpc::Channel& channel);
  // The coordinator read the registration: the heartbeat interval and the
  // lease start.
  void OnRegistered(const loom::v1::Registered& registered);
  // Beats on the liveness path the registration granted (none without a
  // grant, or when no UDP socket reaches the coordinator's host: said once);
  // any earlier beater is stopped. On the stream's reader thread, without
  // mu_ (it resolves the coordinator's host).
  void StartBeats(const loom::v1::Registered& registered);
  void Dispatch(const loom::v1::CoordinatorMessage& message);
  // The oldest pending progress reports, at most kMaxProgressBatch and
  // rpc::kMaxProgressBatchBytes, as one message (mu_ held).
  loom::v1::NodeMessage TakeProgressBatchLocked();

  // Queues a message for the current (or next) stream.
  void Send(loom::v1::NodeMessage message);

  const NodeSessionOptions options_;
  RankCommands* const ranks_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<loom::v1::NodeMessage> outbox_;
  std::deque<loom::v1::RankProgress> pending_progress_;  // not yet in a batch
  std::deque<int64_t> pending_progress_sizes_;           // their encoded sizes, in order
  int64_t pending_progress_bytes_ = 0;                    // the sum of those
  Clock::time_point progress_due_;                       // of the oldest pending
  int64_t progress_dropped_ = 0;
  bool stopping_ = false;
  bool running_ = false;     // inside Run
  bool registered_ = false;  // on the current stream
  bool broken_ = false;      // the current stream has ended
  grpc::ClientContext* context_ = nullptr;  // of the current stream
  absl::Duration heartbeat_interval_;
  Clock::time_point next_heartbeat_;
  // Heartbeats and liveness beats: one sequence (the beater takes its
  // numbers from its own thread).
  std::atomic<int64_t> heartbeat_seq_{0};
  // The current stream's liveness beats (Registered.liveness), if any.
  std::unique_ptr<LivenessBeater> beater_;
  Clock::time_point register_sent_;  // of the current stream's RegisterNode
  int64_t streams_opened_ = 0;
  int64_t registrations_ = 0;
  std::string last_error_;  // how the last stream ended
  std::string address_;     // of the coordinator the current stream goes to
  // Last: its thread, which replies through Send, stops before the rest goes.
  std::unique_ptr<LogReadQueue> log_reads_;
};

}  // namespace loom::agent
