// What loom-loadgen's simulated cluster counts while it runs: every callback
// updates these; the driver reads them for its report (and diffs the message
// counts over a window, such as a recovery).
#pragma once

#include <atomic>
#include <cstdint>

#include "tools/loadgen/latency.h"

namespace loom::loadgen {

// Messages between the fake nodes and the coordinator, by kind: a plain copy,
// so a window's traffic is the difference of two.
struct MessageCounts {
  // From the coordinator, on the node sessions.
  int64_t registered = 0;
  int64_t launches = 0;
  int64_t kills = 0;
  int64_t aborts = 0;
  int64_t enter_epochs = 0;
  int64_t heartbeat_acks = 0;
  int64_t resumes = 0;
  // To it: on the sessions, and RankService calls on the nodes' channels.
  int64_t heartbeats = 0;
  int64_t exits = 0;
  int64_t batches = 0;        // NodeMessage.progress
  int64_t reports = 0;        // RankProgress in them
  int64_t store_batches = 0;  // StoreBatch calls
  int64_t store_ops = 0;      // sets and adds in them
  int64_t store_gets = 0;     // StoreGet calls (one per node and key)

  MessageCounts operator-(const MessageCounts& o) const;
  int64_t from_coordinator() const {
    return registered + launches + kills + aborts + enter_epochs + heartbeat_acks + resumes;
  }
  int64_t to_coordinator() const {
    return heartbeats + exits + batches + store_batches + store_gets;
  }
};

struct ClusterStats {
  std::atomic<int64_t> sessions_registered{0};
  std::atomic<int64_t> sessions_ended{0};  // a session stream ended before shutdown
  std::atomic<int64_t> ranks_ready{0};
  // A node's second skipped because its previous batch was still queued or
  // being written (loadgen or the coordinator lagging): its reports and it.
  std::atomic<int64_t> reports_skipped{0};
  std::atomic<int64_t> batches_skipped{0};
  std::atomic<int64_t> rendezvous_failed{0};
  // Each set and add, timed as the StoreBatch that carried it.
  LatencyRecorder store_latency;
  // From queueing a heartbeat to gRPC taking it: when this nears the node
  // timeout, loadgen itself (not the coordinator) is what lags.
  LatencyRecorder heartbeat_delay;
  // How late each slice of the heartbeat schedule ran (loadgen's own lag).
  LatencyRecorder heartbeat_tick_lateness;
  // From making a heartbeat to reading its HeartbeatAck: the agent's lease
  // runs out when this passes Registered.lease_ms (the coordinator's read
  // lag, the network's and loadgen's own).
  LatencyRecorder ack_delay;

  // Messages, by kind (MessageCounts).
  std::atomic<int64_t> registered{0};
  std::atomic<int64_t> launches{0};
  std::atomic<int64_t> kills{0};
  std::atomic<int64_t> aborts{0};
  std::atomic<int64_t> enter_epochs{0};
  std::atomic<int64_t> heartbeat_acks{0};
  std::atomic<int64_t> resumes{0};
  std::atomic<int64_t> heartbeats_sent{0};
  std::atomic<int64_t> exits_sent{0};
  std::atomic<int64_t> batches_sent{0};
  std::atomic<int64_t> reports_sent{0};
  std::atomic<int64_t> store_batches{0};
  std::atomic<int64_t> store_ops{0};
  std::atomic<int64_t> store_gets{0};

  // In-place recovery, as the ranks lived it.
  std::atomic<int64_t> ranks_aborted{0};  // "aborted" reports sent
  std::atomic<int64_t> ranks_entered{0};  // survivors moved to a new attempt
  // EnterEpoch entries for a rank the node does not run in from_attempt.
  std::atomic<int64_t> epoch_entries_skipped{0};
  // Survivors told to roll back to a step they hold no snapshot of (they
  // exit 1, as loom-trainer does), and restore copies owed that the sender
  // does not hold (the relaunched rank would fail).
  std::atomic<int64_t> restore_failures{0};
  std::atomic<int64_t> restore_copies_missing{0};
  // Aborted ranks that no EnterEpoch reached within the collective timeout
  // (they exit 4, as loom-trainer does).
  std::atomic<int64_t> ranks_gave_up{0};
  // Progress reports of a rank in an attempt older than one its node had
  // already been told of: a survivor left behind.
  std::atomic<int64_t> stale_reports{0};
  // The agents' lease (worker/agent/lease.h): run-outs, ranks paused by
  // them, ranks resumed by ResumeRanks.
  std::atomic<int64_t> lease_expiries{0};
  std::atomic<int64_t> ranks_paused{0};
  std::atomic<int64_t> ranks_resumed{0};

  MessageCounts Messages() const;
};

}  // namespace loom::loadgen
