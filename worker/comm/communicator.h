// The Communicator: one group of ranks and the collectives the engine uses.
// The engine talks only to this interface; Gloo (CPU) and NCCL (GPU) implement
// it. Every operation is bounded by the communicator's timeout and returns an
// error naming the group and the operation instead of hanging.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom::comm {

enum class ReduceOp { kSum, kMax };

// Bytes and calls per operation name ("all_reduce", "send", ...), so tests can
// compare traffic with the analytic volumes (formulas: worker/comm/traffic.h,
// docs/comm.md). Counted when an operation completes successfully.
struct OpCounters {
  int64_t calls = 0;
  // Payload bytes this rank contributed (sent) under the standard algorithm:
  // ring all-reduce 2(n-1)/n of the buffer, ring reduce-scatter and
  // all-gather (n-1)/n of the full buffer, tree broadcast, pairwise all-to-all.
  int64_t bytes = 0;
  // Size of the full, unsharded buffer the operation acts on, for per-layer
  // formulas written in logical sizes (TP: 4*B*S*H per layer).
  int64_t logical_bytes = 0;
};
using CommStats = std::map<std::string, OpCounters>;

// Handle of an operation running in the background.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done (or the timeout passes); safe to call more than once.
  virtual absl::Status Wait() = 0;
  // Where the operation runs on a device (NCCL): once Wait returned OK, how
  // long it ran there, from when the device reached it (the caller's earlier
  // kernels done) to its end: the time it waited for its peers and moved
  // the data, measured with events. Elsewhere nullopt: the host's wait is
  // the measure.
  virtual std::optional<absl::Duration> DeviceTime() const { return std::nullopt; }
};

// A Work that is already finished, for implementations that complete inline.
class DoneWork : public Work {
 public:
  explicit DoneWork(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};

// What a communicator is doing right now, for progress reports and the
// trainer's watchdog ("which collective do the peers wait in").
struct CommProgress {
  int64_t issued = 0;     // operations submitted so far
  int64_t completed = 0;  // operations finished, successfully or not
  std::string current_op;  // the operation running now; empty when idle
  absl::Time current_since = absl::InfinitePast();  // when current_op started
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Group name used in errors and counters, e.g. "dp" or "tp[0,1]".
  virtual const std::string& name() const = 0;

  virtual absl::Status AllReduce(std::span<float> data, ReduceOp op = ReduceOp::kSum) = 0;
  // The span must stay valid and untouched until Wait() returns.
  virtual std::unique_ptr<Work> AllReduceAsync(std::span<float> data,
                                               ReduceOp op = ReduceOp::kSum) = 0;
  // in.size() == out.size() * size(); rank r receives the reduced r-th chunk.
  virtual absl::Status ReduceScatter(std::span<const float> in, std::span<float> out) = 0;
  // out.size() == in.size() * size(); chunks in rank order.
  virtual absl::Status AllGather(std::span<const float> in, std::span<float> out) = 0;
  virtual absl::Status Broadcast(std::span<float> data, int root) = 0;
  virtual absl::Status Send(std::span<const float> data, int peer, uint32_t tag) = 0;
  virtual absl::Status Recv(std::span<float> data, int peer, uint32_t tag) = 0;
  // Uneven all-to-all: send_counts[i] floats go to rank i, recv_counts[i] come from it.
  virtual absl::Status AllToAll(std::span<const float> in, const std::vector<int64_t>& send_counts,
                                std::span<float> out, const std::vector<int64_t>& recv_counts) = 0;
  virtual absl::Status Barrier() = 0;

  // Equal-chunk all-to-all of integers, for control values (the expert
  // dispatcher's per-expert token counts) that must arrive exactly and so
  // never travel as floats: in.size() == out.size(), a multiple of size();
  // chunk i of `in` goes to rank i, chunk j of `out` came from rank j. The
  // buffers are the communicator's memory, like the float collectives' (host
  // for Gloo, device for NCCL). Counted as "all_to_all_int64". The default
  // refuses, for test doubles that never need it.
  virtual absl::Status AllToAllInt64(std::span<const int64_t> in, std::span<int64_t> out) {
    return absl::UnimplementedError("group " + name() + ": all_to_all_int64 is not implemented here");
  }

  virtual CommStats Stats() const = 0;

  // Posting versions of Send/Recv: a pipeline stage must have a send and a
  // receive in flight together (activations one way, gradients the other),
  // which two blocking calls in a fixed order cannot do without deadlock. The
  // span must stay valid until Wait() returns. The defaults complete inline.
  virtual std::unique_ptr<Work> SendAsync(std::span<const float> data, int peer, uint32_t tag) {
    return std::make_unique<DoneWork>(Send(data, peer, tag));
  }
  virtual std::unique_ptr<Work> RecvAsync(std::span<float> data, int peer, uint32_t tag) {
    return std::make_unique<DoneWork>(Recv(data, peer, tag));
  }
  // Starts the sends and receives posted so far and not yet started. An
  // implementation that holds posts to launch them together (NCCL: one group,
  // since its transfers match by order and a lone send could wait forever on
  // a receive queued behind it) otherwise starts them only at the first Wait
  // or the next collective, after whatever the caller computes in between; a
  // caller that wants its transfers to overlap that computation posts every
  // transfer its peers need matched together (a ring's receive and send),
  // then calls this. Implementations that start each post at once (Gloo)
  // have nothing to do: the default.
  virtual void StartPosted() {}

  // For a watchdog thread: stops the communicator for good. Operations
  // blocked in it return ABORTED promptly, and so does every later call.
  // Safe from any thread, any number of times.
  virtual void Abort(const std::string& reason) {}

  virtual CommProgress Progress() const { return {}; }
  // Work::DeviceTime of the last synchronous call the calling thread made
  // on this group (nullopt where there is none, or no device).
  virtual std::optional<absl::Duration> LastDeviceTime() const { return std::nullopt; }
};

}  // namespace loom::comm
