// The coordinator's end of the liveness path (docs/fault_tolerance.md,
// "Lost nodes"): UDP sockets and one thread of its own, outside gRPC, that
// reads the agents' beats, records them on the LivenessBoard and answers
// each authentic one with its ack. Node sessions, like every other RPC, are
// served on gRPC's shared threads, where a handler that waits (for the job
// table, behind ten thousand submissions) can hold up the next session's
// heartbeat; nothing here waits for anything but the board's own short lock.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/cluster/liveness_board.h"

namespace loom::coordinator {

class LivenessListener {
 public:
  // Bound to UDP host:port (every address host resolves to; port 0: one the
  // system picks) and reading at once. The error names the address.
  static absl::StatusOr<std::unique_ptr<LivenessListener>> Start(const std::string& host, int port,
                                                                 LivenessBoard* board);
  ~LivenessListener();  // stops reading and closes the sockets
  LivenessListener(const LivenessListener&) = delete;
  LivenessListener& operator=(const LivenessListener&) = delete;

  // The port bound (of the first address).
  int port() const { return port_; }

 private:
  LivenessListener(std::vector<int> sockets, int wake_read, int wake_write, LivenessBoard* board);
  void Run();
  // Reads what is waiting on one socket (a bounded number per wake, so one
  // flooded socket does not keep the others unread) and answers.
  void Drain(int fd);

  const std::vector<int> sockets_;
  const int wake_read_;
  const int wake_write_;
  LivenessBoard* const board_;
  int port_ = 0;
  std::thread thread_;  // last: starts after the rest exists
};

}  // namespace loom::coordinator
