// The four tensor-parallel communication patterns of the model, over the TP
// group's Communicator, on backend memory. Megatron's f/g pair: without
// sequence parallelism the residual stream is replicated, a TP region's input
// needs nothing and its output is all-reduced; with it the stream is split
// by token rows, the input is all-gathered and the output reduce-scattered.
// The backward of each is the other one.
//
// Errors are sticky for one model call: the first failed collective is kept,
// later ones are skipped (their outputs are then meaningless), and the model
// reports the status when the call ends. The Communicator is broken by any
// failure anyway, so there is nothing to resume.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"

namespace loom::engine {

class TpCollectives {
 public:
  TpCollectives(comm::Communicator* comm, kernels::Ops* ops, bool sequence_parallel)
      : comm_(comm), ops_(ops), sp_(sequence_parallel) {}

  int size() const { return comm_->size(); }
  int rank() const { return comm_->rank(); }
  bool sequence_parallel() const { return sp_; }

  // The full [rows * size, width] rows from this rank's [rows, width]: an
  // all-gather into `full` with sequence parallelism; otherwise `rows` is
  // already full and is returned as is.
  const float* GatherRows(const float* rows, int64_t local_floats, float* full);
  // Sums `partial` ([full rows, width]) over the group and leaves this rank's
  // rows in `out`: a reduce-scatter with sequence parallelism, otherwise an
  // all-reduce in place (then copied to `out` unless it is `partial`).
  void ReduceRows(float* partial, int64_t full_floats, float* out);
  void AllReduce(float* data, int64_t n);
  // out: [size * n], the ranks' `in` in rank order.
  void AllGather(const float* in, int64_t n, float* out);

  const absl::Status& status() const { return status_; }
  void ResetStatus() { status_ = absl::OkStatus(); }

 private:
  void Keep(absl::Status s) {
    if (status_.ok() && !s.ok()) status_ = std::move(s);
  }

  comm::Communicator* comm_;
  kernels::Ops* ops_;
  bool sp_;
  absl::Status status_;
};

}  // namespace loom::engine
