// Ring attention over the context-parallel group (docs/context_parallel.md):
// each rank holds two zigzag chunks of every sequence (zigzag.h); keys and
// values circulate around the ring, one step per peer, each step's send and
// receive posted before the step's blocks are computed (RingBlocks), so the
// transfer overlaps the arithmetic. The backward circulates K/V again, and
// with them each owner's dK/dV accumulator (a step's share is computed while
// the accumulator is still arriving, then added), which after the last step
// is sent home. Works on backend memory: host buffers over Gloo, device
// buffers over NCCL.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/context_parallel/ring_blocks.h"
#include "worker/engine/context_parallel/zigzag.h"

namespace loom::engine {

// Bytes one rank sends in one Forward / Backward of a group of cp ranks:
// the K/V block (RingKvFloats) to the next rank cp - 1 times forward; in the
// backward the same, plus the dK/dV accumulator once per step (cp times: the
// last one takes it home). The planner's CP traffic model is this formula.
struct RingTraffic {
  int64_t forward_bytes = 0;
  int64_t backward_bytes = 0;
};
RingTraffic RingTrafficBytes(const RingDims& d, const ZigzagSplit& z);

class RingAttention {
 public:
  // `ops` and the CP group `cp` (rank = position in the sequence split) must
  // outlive this.
  RingAttention(kernels::Ops& ops, comm::Communicator& cp);

  // qkv: this rank's rows [batch * 2C, qkv_stride] holding q (columns
  // [0, q_width)), k and v (the next kv_width columns each), after RoPE.
  // Writes out [batch * 2C, q_width] and lse [batch, 2, heads, C].
  absl::Status Forward(const RingDims& d, const ZigzagSplit& z, const float* qkv,
                       int64_t qkv_stride, float* out, float* lse);
  // Overwrites dqkv (like qkv) with d(loss)/d(q, k, v) of this rank's rows,
  // given Forward's out and lse and d_out (like out). Collective, like Forward.
  absl::Status Backward(const RingDims& d, const ZigzagSplit& z, const float* qkv,
                        int64_t qkv_stride, const float* out, const float* lse, const float* d_out,
                        float* dqkv);

  // Attention FLOPs this rank computed so far (ring_blocks.h counts them).
  RingFlops flops() const;
  // Backend bytes the ring holds (gathered q and dq, two K/V blocks, two
  // dK/dV accumulators and one step's dK/dV share, a block's scratch): part
  // of the model's activation memory.
  int64_t BufferBytes() const;
  comm::Communicator& group() { return cp_; }

 private:
  // Buffers and block scratch for these dims; q and kv gathered from qkv.
  void Prepare(const RingDims& d, const ZigzagSplit& z, const float* qkv, int64_t qkv_stride);
  // Posts kv[from] -> next rank and kv[to] <- previous rank, and starts them.
  absl::Status Exchange(kernels::Buffer& send, kernels::Buffer& recv, int64_t floats,
                        uint32_t tag, std::unique_ptr<comm::Work>* sent,
                        std::unique_ptr<comm::Work>* received);

  kernels::Ops& ops_;
  comm::Communicator& cp_;
  RingDims dims_{};
  ZigzagSplit split_{};
  std::unique_ptr<RingBlocks> blocks_;
  RingFlops done_{};  // flops of earlier RingBlocks (dims changed)
  kernels::Buffer q_, kv_[2], dq_, dkv_[2], dkv_share_;
  uint32_t calls_ = 0;
};

}  // namespace loom::engine
