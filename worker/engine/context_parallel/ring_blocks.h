// The arithmetic of ring attention on one rank, one key/value block at a
// time, through the ops API (so it runs on any backend): this rank's queries
// against one owner's K/V under the zigzag split's global positions, partial
// results merged by the log-sum-exp rule; and the blockwise backward, which
// recomputes each block's probabilities from the FINAL log-sum-exp and
// output (so a block's dQ, dK, dV are exactly its share of the full
// gradient). No communication here: RingAttention (ring_attention.h) moves
// the blocks, and tests drive these functions over all owners in one process.
//
// Local layouts, all contiguous and backend memory (C = chunk, B = batch):
//   q    [B, 2C, heads * head_dim]         (local chunk 0, then 1, per sequence)
//   kv   [2][B, 2C, kv_heads * head_dim]   (K, then V: one buffer to send)
//   out  [B, 2C, heads * head_dim]
//   lse  [B, 2, heads, C]                  (per sequence and local chunk)
#pragma once

#include <cstdint>

#include "kernels/ops.h"
#include "worker/engine/context_parallel/zigzag.h"

namespace loom::engine {

struct RingDims {
  int64_t batch = 1;
  int64_t heads = 1, kv_heads = 1, head_dim = 1;
  bool causal = true;
  float scale = 1.0f;

  int64_t q_width() const { return heads * head_dim; }
  int64_t kv_width() const { return kv_heads * head_dim; }
};

// Floats of the local tensors above.
int64_t RingQFloats(const RingDims& d, const ZigzagSplit& z);
int64_t RingKvFloats(const RingDims& d, const ZigzagSplit& z);  // K and V
int64_t RingLseFloats(const RingDims& d, const ZigzagSplit& z);

// Attention FLOPs counted per visible (query, key) pair and head: 4 * head_dim
// forward (QK^T and PV), 8 * head_dim backward (dV, dP, dQ, dK). Skipped
// blocks count nothing, so the counter shows the zigzag's balance.
struct RingFlops {
  int64_t forward = 0;
  int64_t backward = 0;
};

class RingBlocks {
 public:
  // `ops` must outlive this; scratch for one block is allocated here.
  RingBlocks(kernels::Ops& ops, const RingDims& dims, const ZigzagSplit& split, int rank);

  // out = 0 and lse = -inf: the merge identity.
  void BeginForward(float* out, float* lse);
  // Merges rank `rank`'s queries attended to `owner`'s K/V into out and lse.
  void ForwardBlock(const float* q, const float* kv, int owner, float* out, float* lse);
  // ADDS this block's dQ into dq (like q) and its dK, dV into dkv (like kv,
  // the owner's gradient), given the final out and lse and d_out (like out).
  void BackwardBlock(const float* q, const float* kv, int owner, const float* out,
                     const float* lse, const float* d_out, float* dq, float* dkv);

  const RingFlops& flops() const { return flops_; }
  int64_t ScratchBytes() const {
    return out_blk_.bytes() + lse_blk_.bytes() + dq_blk_.bytes() + dk_blk_.bytes() +
           dv_blk_.bytes();
  }

 private:
  kernels::AttentionDims BlockDims(int64_t q_chunk, int64_t kv_chunk) const;

  kernels::Ops& ops_;
  RingDims d_;
  ZigzagSplit z_;
  int rank_;
  kernels::Buffer out_blk_, lse_blk_, dq_blk_, dk_blk_, dv_blk_;
  RingFlops flops_;
};

}  // namespace loom::engine
