// What the attention forward and backward kernels share: the parameter block,
// the validation of AttentionDims, and the swizzled tile loader. Device code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/hd/tile_math.h"
#include "kernels/ops.h"

namespace loom::kernels::cuda {

using bf16 = __nv_bfloat16;

struct AttentionParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const bf16* o;
  const bf16* d_o;
  bf16* out;
  float* lse;
  bf16* dq;
  bf16* dk;
  bf16* dv;
  float* dq_accum;  // [batch, seq_q, heads_q, head_dim], fp32
  float* dvec;      // [batch, heads_q, seq_q]: rowsum(dO * O)
  int64_t q_stride, k_stride, v_stride, o_stride;  // elements between tokens
  int batch, seq_q, seq_kv, heads_q, heads_kv;
  int shift;  // q_offset - kv_offset
  bool causal;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
};

// Checks what the kernels assume: supported head dim, whole groups, 16-byte
// aligned rows (cp.async), sizes that fit the int index arithmetic.
inline bool AttentionDimsSupported(const AttentionDims& d) {
  if (d.head_dim != 64 && d.head_dim != 128) return false;
  if (d.batch < 1 || d.seq_q < 1 || d.seq_kv < 1 || d.num_heads < 1 || d.num_kv_heads < 1) return false;
  if (d.num_heads % d.num_kv_heads != 0) return false;
  for (int64_t s : {d.q_row_stride, d.k_row_stride, d.v_row_stride, d.o_row_stride})
    if (s % 8 != 0 || s <= 0) return false;
  if (d.q_row_stride < d.num_heads * d.head_dim || d.o_row_stride < d.num_heads * d.head_dim) return false;
  if (d.k_row_stride < d.num_kv_heads * d.head_dim || d.v_row_stride < d.num_kv_heads * d.head_dim) return false;
  if (d.seq_q > (1 << 24) || d.seq_kv > (1 << 24) || d.batch > 65535 || d.num_heads > 65535) return false;
  return true;
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline AttentionParams MakeAttentionParams(const AttentionDims& d) {
  AttentionParams p{};
  p.q_stride = d.q_row_stride;
  p.k_stride = d.k_row_stride;
  p.v_stride = d.v_row_stride;
  p.o_stride = d.o_row_stride;
  p.batch = static_cast<int>(d.batch);
  p.seq_q = static_cast<int>(d.seq_q);
  p.seq_kv = static_cast<int>(d.seq_kv);
  p.heads_q = static_cast<int>(d.num_heads);
  p.heads_kv = static_cast<int>(d.num_kv_heads);
  p.shift = static_cast<int>(d.q_offset - d.kv_offset);
  p.causal = d.causal;
  p.scale = d.scale;
  p.scale_log2 = d.scale * 1.4426950408889634f;
  return p;
}

// Copies rows [row0, row0 + kRows) of a [seq, kD] head slice (token stride
// `stride`) into a swizzled [kRows][kD] shared tile; rows past seq are zeros.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void LoadTileAsync(bf16* smem, const bf16* base, int row0, int seq,
                                              int64_t stride, int tid) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    int c = tid + i * kThreads;
    int r = c / kChunksPerRow, ch = c % kChunksPerRow;
    int row = row0 + r;
    bool valid = row < seq;
    const bf16* src = base + (valid ? static_cast<int64_t>(row) * stride + ch * 8 : 0);
    CpAsync16(smem + SwizzledOffset16(r, ch * 8, kD), src, valid);
  }
}

}  // namespace loom::kernels::cuda
