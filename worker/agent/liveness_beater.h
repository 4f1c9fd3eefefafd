// The agent's end of the liveness path (docs/fault_tolerance.md, "Lost
// nodes"): one thread that sends a beat to the coordinator every heartbeat
// interval as a UDP datagram sealed with the session's grant
// (common/liveness/beat_datagram.h) and feeds each authentic ack to the lease
// as a HeartbeatAck. Beats share the heartbeats' sequence, so the lease runs
// from the newest acknowledged one of either kind. Independent of the
// session's stream: a coordinator whose session handling is held up still
// acks beats, and the agent's ranks are not paused for it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/liveness/beat_datagram.h"
#include "worker/agent/lease.h"

namespace loom::agent {

class LivenessBeater {
 public:
  struct Options {
    std::string host;  // the coordinator's, as the session reached it
    int port = 0;      // LivenessGrant.port
    std::string node_id;
    liveness::Grant grant;
    absl::Duration interval = absl::Seconds(1);
    Lease* lease = nullptr;            // fed each ack; may be null
    std::atomic<int64_t>* seq = nullptr;  // the session's heartbeat sequence
  };
  // Beating at once, then every interval, until destroyed. The error names
  // the coordinator's address when no UDP socket reaches it.
  static absl::StatusOr<std::unique_ptr<LivenessBeater>> Start(Options options);
  ~LivenessBeater();
  LivenessBeater(const LivenessBeater&) = delete;
  LivenessBeater& operator=(const LivenessBeater&) = delete;

  int64_t sent() const { return sent_.load(); }
  int64_t acked() const { return acked_.load(); }

 private:
  LivenessBeater(Options options, int fd, int wake_read, int wake_write);
  void Run();
  void Send();
  void ReadAcks();

  const Options options_;
  const int fd_;
  const int wake_read_;
  const int wake_write_;
  std::atomic<int64_t> sent_{0};
  std::atomic<int64_t> acked_{0};
  std::thread thread_;  // last: starts after the rest exists
};

}  // namespace loom::agent
