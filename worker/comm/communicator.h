// The Communicator: one group of ranks and the collectives the engine uses.
// The engine talks only to this interface; Gloo (CPU) and NCCL (GPU) implement
// it. Every operation is bounded by the communicator's timeout and returns an
// error naming the group and the operation instead of hanging.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom::comm {

enum class ReduceOp { kSum, kMax };

// Bytes and calls per operation name ("all_reduce", "send", ...), so tests can
// compare traffic with the analytic volumes.
struct OpCounters {
  int64_t calls = 0;
  int64_t bytes = 0;  // payload bytes this rank contributed (sent)
};
using CommStats = std::map<std::string, OpCounters>;

// Handle of an operation running in the background.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done (or the timeout passes); safe to call more than once.
  virtual absl::Status Wait() = 0;
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

  virtual CommStats Stats() const = 0;
};

}  // namespace loom::comm
