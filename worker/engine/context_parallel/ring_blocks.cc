#include "worker/engine/context_parallel/ring_blocks.h"

#include <limits>

namespace loom::engine {

int64_t RingQFloats(const RingDims& d, const ZigzagSplit& z) {
  return d.batch * z.local_seq() * d.q_width();
}
int64_t RingKvFloats(const RingDims& d, const ZigzagSplit& z) {
  return 2 * d.batch * z.local_seq() * d.kv_width();
}
int64_t RingLseFloats(const RingDims& d, const ZigzagSplit& z) {
  return d.batch * z.local_seq() * d.heads;
}

RingBlocks::RingBlocks(kernels::Ops& ops, const RingDims& dims, const ZigzagSplit& split,
                       int rank)
    : ops_(ops), d_(dims), z_(split), rank_(rank) {
  const int64_t c = z_.chunk;
  out_blk_ = ops_.AllocateFloats(c * d_.q_width());
  lse_blk_ = ops_.AllocateFloats(c * d_.heads);
  dq_blk_ = ops_.AllocateFloats(c * d_.q_width());
  dk_blk_ = ops_.AllocateFloats(c * d_.kv_width());
  dv_blk_ = ops_.AllocateFloats(c * d_.kv_width());
}

// One (query chunk, key chunk) block of one sequence: batch 1, positions
// from the global chunk indices, so the kernel's causal mask is the global one.
kernels::AttentionDims RingBlocks::BlockDims(int64_t q_chunk, int64_t kv_chunk) const {
  kernels::AttentionDims a;
  a.batch = 1;
  a.seq_q = a.seq_kv = z_.chunk;
  a.num_heads = d_.heads;
  a.num_kv_heads = d_.kv_heads;
  a.head_dim = d_.head_dim;
  a.causal = d_.causal;
  a.scale = d_.scale;
  a.q_row_stride = a.o_row_stride = d_.q_width();
  a.k_row_stride = a.v_row_stride = d_.kv_width();
  a.q_offset = q_chunk * z_.chunk;
  a.kv_offset = kv_chunk * z_.chunk;
  return a;
}

void RingBlocks::BeginForward(float* out, float* lse) {
  ops_.Fill(out, RingQFloats(d_, z_), 0.0f);
  ops_.Fill(lse, RingLseFloats(d_, z_), -std::numeric_limits<float>::infinity());
}

void RingBlocks::ForwardBlock(const float* q, const float* kv, int owner, float* out,
                              float* lse) {
  const int64_t c = z_.chunk, s = z_.local_seq(), qw = d_.q_width(), kw = d_.kv_width();
  const float* v = kv + d_.batch * s * kw;
  for (int qc = 0; qc < 2; ++qc) {
    const int64_t q_chunk = z_.ChunkIndex(rank_, qc);
    for (int kc = 0; kc < 2; ++kc) {
      const int64_t kv_chunk = z_.ChunkIndex(owner, kc);
      const int64_t pairs = VisiblePairs(d_.causal, q_chunk, kv_chunk, c);
      if (pairs == 0) continue;  // the causal mask empties this block
      const kernels::AttentionDims a = BlockDims(q_chunk, kv_chunk);
      for (int64_t b = 0; b < d_.batch; ++b) {
        const int64_t q_row = b * s + qc * c, kv_row = b * s + kc * c;
        ops_.AttentionForward(a, q + q_row * qw, kv + kv_row * kw, v + kv_row * kw,
                              out_blk_.f32(), lse_blk_.f32());
        ops_.AttentionMerge(c, d_.heads, d_.head_dim, out + q_row * qw, qw,
                            lse + (b * 2 + qc) * d_.heads * c, out_blk_.f32(), qw,
                            lse_blk_.f32());
        flops_.forward += 4 * d_.head_dim * d_.heads * pairs;
      }
    }
  }
}

void RingBlocks::BackwardBlock(const float* q, const float* kv, int owner, const float* out,
                               const float* lse, const float* d_out, float* dq, float* dkv) {
  const int64_t c = z_.chunk, s = z_.local_seq(), qw = d_.q_width(), kw = d_.kv_width();
  const float* v = kv + d_.batch * s * kw;
  float* dv = dkv + d_.batch * s * kw;
  for (int qc = 0; qc < 2; ++qc) {
    const int64_t q_chunk = z_.ChunkIndex(rank_, qc);
    for (int kc = 0; kc < 2; ++kc) {
      const int64_t kv_chunk = z_.ChunkIndex(owner, kc);
      const int64_t pairs = VisiblePairs(d_.causal, q_chunk, kv_chunk, c);
      if (pairs == 0) continue;
      const kernels::AttentionDims a = BlockDims(q_chunk, kv_chunk);
      for (int64_t b = 0; b < d_.batch; ++b) {
        const int64_t q_row = b * s + qc * c, kv_row = b * s + kc * c;
        ops_.AttentionBackward(a, q + q_row * qw, kv + kv_row * kw, v + kv_row * kw,
                               out + q_row * qw, lse + (b * 2 + qc) * d_.heads * c,
                               d_out + q_row * qw, dq_blk_.f32(), dk_blk_.f32(), dv_blk_.f32());
        ops_.Axpy(c * qw, 1.0f, dq_blk_.f32(), dq + q_row * qw);
        ops_.Axpy(c * kw, 1.0f, dk_blk_.f32(), dkv + kv_row * kw);
        ops_.Axpy(c * kw, 1.0f, dv_blk_.f32(), dv + kv_row * kw);
        flops_.backward += 8 * d_.head_dim * d_.heads * pairs;
      }
    }
  }
}

}  // namespace loom::engine
