#include "worker/engine/model/llama_layer.h"

#include <cmath>

namespace loom::engine {

using kernels::Transpose;
constexpr Transpose kN = Transpose::kNo;
constexpr Transpose kT = Transpose::kYes;

kernels::AttentionDims BlockAttentionDims(const BlockDims& d) {
  kernels::AttentionDims a;
  a.batch = d.batch;
  a.seq_q = a.seq_kv = d.seq;
  a.num_heads = d.heads;
  a.num_kv_heads = d.kv_heads;
  a.head_dim = d.head_dim;
  a.causal = true;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  a.q_row_stride = a.k_row_stride = a.v_row_stride = d.qkv_dim;
  a.o_row_stride = d.q_dim;
  return a;
}

namespace {

RingDims BlockRingDims(const BlockDims& d) {
  RingDims r;
  r.batch = d.batch;
  r.heads = d.heads;
  r.kv_heads = d.kv_heads;
  r.head_dim = d.head_dim;
  r.causal = true;
  r.scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  return r;
}

// RoPE (or its inverse) on q and k of a.qkv-shaped rows; under CP each local
// chunk of each sequence at its global position.
void Rope(kernels::Ops& ops, const BlockDims& d, const RopeView& rope, float* x, bool backward,
          const BlockCp* cp) {
  auto apply = [&](float* at, int64_t batch, int64_t seq, int64_t heads, int64_t position) {
    if (backward) {
      ops.RopeBackward(at, batch, seq, heads, d.head_dim, d.qkv_dim, rope.cos, rope.sin, position);
    } else {
      ops.RopeForward(at, batch, seq, heads, d.head_dim, d.qkv_dim, rope.cos, rope.sin, position);
    }
  };
  if (cp == nullptr) {
    apply(x, d.batch, d.seq, d.heads, 0);
    apply(x + d.q_dim, d.batch, d.seq, d.kv_heads, 0);
    return;
  }
  const int64_t c = cp->split.chunk;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int k = 0; k < 2; ++k) {
      float* rows = x + (b * d.seq + k * c) * d.qkv_dim;
      const int64_t position = cp->split.ChunkStart(cp->rank, k);
      apply(rows, 1, c, d.heads, position);
      apply(rows + d.q_dim, 1, c, d.kv_heads, position);
    }
}

}  // namespace

void BlockAttentionCore(kernels::Ops& ops, const BlockDims& d, const BlockActivations& a,
                        const BlockCp* cp) {
  if (cp == nullptr) {
    ops.AttentionForward(BlockAttentionDims(d), a.qkv, a.qkv + d.q_dim,
                         a.qkv + d.q_dim + d.kv_dim, a.attn, a.lse);
    return;
  }
  if (!cp->status->ok()) return;
  cp->status->Update(cp->ring->Forward(BlockRingDims(d), cp->split, a.qkv, d.qkv_dim, a.attn, a.lse));
}

void BlockForward(kernels::Ops& ops, const BlockDims& d, const BlockWeights& w,
                  const RopeView& rope, const BlockActivations& a, float* x_next,
                  const BlockTp* tp, const BlockCp* cp, const MoeBlock* moe) {
  // Every GEMM of a block is a linear layer's (the fp8 recipe quantizes them).
  const kernels::GemmScopeGuard linear(ops, kernels::GemmScope::kLinear);
  const int64_t t = d.tokens, h = d.hidden, rows = d.rows;
  const bool sp = tp != nullptr && tp->coll->sequence_parallel();
  // With sequence parallelism a norm sees this rank's rows and its output is
  // all-gathered into the full rows the column-parallel GEMM reads.
  ops.RmsNormForward(a.x_in, w.input_norm, rows, h, d.eps, sp ? tp->rows : a.h1, a.rstd1);
  if (sp) tp->coll->AllGather(tp->rows, rows * h, a.h1);
  ops.Gemm(kN, kT, t, d.qkv_dim, h, 1.0f, a.h1, h, w.qkv, h, 0.0f, a.qkv, d.qkv_dim);
  Rope(ops, d, rope, a.qkv, false, cp);
  BlockAttentionCore(ops, d, a, cp);
  if (tp == nullptr) {
    // Residual adds ride on GEMM beta = 1: x_mid = x_in + attn @ o^T.
    ops.CopyDeviceToDevice(a.x_mid, a.x_in, t * h * static_cast<int64_t>(sizeof(float)));
    ops.Gemm(kN, kT, t, h, d.q_dim, 1.0f, a.attn, d.q_dim, w.o, d.q_dim, 1.0f, a.x_mid, h);
  } else {
    // Row-parallel: each rank's heads give a partial sum of the projection.
    ops.Gemm(kN, kT, t, h, d.q_dim, 1.0f, a.attn, d.q_dim, w.o, d.q_dim, 0.0f, tp->partial, h);
    tp->coll->ReduceRows(tp->partial, t * h, a.x_mid);
    ops.Axpy(rows * h, 1.0f, a.x_in, a.x_mid);
  }
  ops.RmsNormForward(a.x_mid, w.post_norm, rows, h, d.eps, sp ? tp->rows : a.h2, a.rstd2);
  if (sp) tp->coll->AllGather(tp->rows, rows * h, a.h2);
  if (moe != nullptr) {  // [moe] whole on every TP rank, no SP (CheckEngineRuns)
    absl::Status st = moe->layer->Forward(moe->dims, moe->w, a.h2, a.x_mid, x_next);
    if (!st.ok() && moe->status->ok()) *moe->status = st;
    return;
  }
  ops.Gemm(kN, kT, t, 2 * d.ffn, h, 1.0f, a.h2, h, w.gate_up, h, 0.0f, a.gu, 2 * d.ffn);
  ops.SwiGluForward(t, d.ffn, a.gu, a.gu + d.ffn, 2 * d.ffn, a.act, d.ffn);
  if (x_next == nullptr) return;
  if (tp == nullptr) {
    ops.CopyDeviceToDevice(x_next, a.x_mid, t * h * static_cast<int64_t>(sizeof(float)));
    ops.Gemm(kN, kT, t, h, d.ffn, 1.0f, a.act, d.ffn, w.down, d.ffn, 1.0f, x_next, h);
  } else {
    ops.Gemm(kN, kT, t, h, d.ffn, 1.0f, a.act, d.ffn, w.down, d.ffn, 0.0f, tp->partial, h);
    tp->coll->ReduceRows(tp->partial, t * h, x_next);
    ops.Axpy(rows * h, 1.0f, a.x_mid, x_next);
  }
}

void BlockBackward(kernels::Ops& ops, const BlockDims& d, const BlockWeights& w,
                   const BlockGrads& g, const RopeView& rope, const BlockActivations& a,
                   const BlockScratch& s, float* dx, const BlockTp* tp, const BlockCp* cp,
                   const MoeBlock* moe) {
  const kernels::GemmScopeGuard linear(ops, kernels::GemmScope::kLinear);
  const int64_t t = d.tokens, h = d.hidden, f = d.ffn, rows = d.rows;
  const bool sp = tp != nullptr && tp->coll->sequence_parallel();
  // The gradient of a row-parallel output is dx (all-gathered under SP); the
  // input gradient of a column-parallel GEMM is a partial sum over ranks
  // (reduced, and reduce-scattered under SP) before its norm's backward.
  float* dh_full = sp ? tp->partial : s.dh;
  // MLP: dx is the gradient of the block output = of down_proj's output.
  const float* dy = tp != nullptr ? tp->coll->GatherRows(dx, rows * h, tp->full) : dx;
  if (moe != nullptr) {  // [moe] whole on every TP rank, no SP (CheckEngineRuns)
    absl::Status st = moe->layer->Backward(moe->dims, moe->w, moe->g, a.h2, dy, moe->loss_scale,
                                           *moe->scratch, s.dh);
    if (!st.ok() && moe->status->ok()) *moe->status = st;
  } else {
  ops.Gemm(kT, kN, h, f, t, 1.0f, dy, h, a.act, f, 1.0f, g.down, f);
  ops.Gemm(kN, kN, t, f, h, 1.0f, dy, h, w.down, f, 0.0f, s.d_act, f);
  ops.SwiGluBackward(t, f, a.gu, a.gu + f, 2 * f, s.d_act, f, s.dgu, s.dgu + f);
  ops.Gemm(kT, kN, 2 * f, h, t, 1.0f, s.dgu, 2 * f, a.h2, h, 1.0f, g.gate_up, h);
  ops.Gemm(kN, kN, t, h, 2 * f, 1.0f, s.dgu, 2 * f, w.gate_up, h, 0.0f, dh_full, h);
  if (tp != nullptr) tp->coll->ReduceRows(dh_full, t * h, s.dh);
  }
  ops.RmsNormBackward(s.dh, a.x_mid, w.post_norm, a.rstd2, rows, h, dx, true, g.post_norm);
  // Attention: dx is now the gradient of x_mid = of o_proj's output.
  dy = tp != nullptr ? tp->coll->GatherRows(dx, rows * h, tp->full) : dx;
  ops.Gemm(kT, kN, h, d.q_dim, t, 1.0f, dy, h, a.attn, d.q_dim, 1.0f, g.o, d.q_dim);
  ops.Gemm(kN, kN, t, d.q_dim, h, 1.0f, dy, h, w.o, d.q_dim, 0.0f, s.d_attn, d.q_dim);
  if (cp == nullptr) {
    ops.AttentionBackward(BlockAttentionDims(d), a.qkv, a.qkv + d.q_dim,
                          a.qkv + d.q_dim + d.kv_dim, a.attn, a.lse, s.d_attn, s.dqkv,
                          s.dqkv + d.q_dim, s.dqkv + d.q_dim + d.kv_dim);
  } else if (cp->status->ok()) {
    cp->status->Update(cp->ring->Backward(BlockRingDims(d), cp->split, a.qkv, d.qkv_dim, a.attn,
                                          a.lse, s.d_attn, s.dqkv));
  }
  Rope(ops, d, rope, s.dqkv, true, cp);
  if (g.kv == nullptr) {
    ops.Gemm(kT, kN, d.qkv_dim, h, t, 1.0f, s.dqkv, d.qkv_dim, a.h1, h, 1.0f, g.qkv, h);
  } else {
    ops.Gemm(kT, kN, d.q_dim, h, t, 1.0f, s.dqkv, d.qkv_dim, a.h1, h, 1.0f, g.qkv, h);
    ops.Gemm(kT, kN, 2 * d.kv_dim, h, t, 1.0f, s.dqkv + d.q_dim, d.qkv_dim, a.h1, h, 1.0f, g.kv,
             h);
  }
  ops.Gemm(kN, kN, t, h, d.qkv_dim, 1.0f, s.dqkv, d.qkv_dim, w.qkv, h, 0.0f, dh_full, h);
  if (tp != nullptr) tp->coll->ReduceRows(dh_full, t * h, s.dh);
  ops.RmsNormBackward(s.dh, a.x_in, w.input_norm, a.rstd1, rows, h, dx, true, g.input_norm);
}

}  // namespace loom::engine
