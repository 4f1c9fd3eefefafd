// One Llama decoder block's forward and backward as a sequence of ops-API
// calls on caller-owned buffers. The model decides which activations persist
// (the recompute modes) by where these pointers point; the block itself does
// not know or care. Internal to the model.
//
// Under tensor parallelism the dims and weights are this rank's (its query
// and kv heads, its FFN columns) and a BlockTp carries the collectives: the
// residual stream (x_in, x_mid, rstd*, dx) then has d.rows rows, which is
// d.tokens / tp with sequence parallelism and d.tokens without; everything
// between a block's norms and its row-parallel projections has d.tokens rows.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "worker/engine/context_parallel/ring_attention.h"
#include "worker/engine/context_parallel/zigzag.h"
#include "worker/engine/model/moe_layer.h"
#include "worker/engine/tensor_parallel/tp_collectives.h"

namespace loom::engine {

struct BlockDims {
  int64_t batch = 0, seq = 0, tokens = 0;  // tokens = batch * seq
  int64_t rows = 0;  // residual-stream rows on this rank (tokens unless sequence-parallel)
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t q_dim = 0, kv_dim = 0, qkv_dim = 0;  // qkv_dim = q_dim + 2 kv_dim
  int64_t ffn = 0;
  float eps = 1e-5f;
};

struct BlockWeights {
  const float* input_norm;
  const float* qkv;  // [qkv_dim, hidden]: q_proj; k_proj; v_proj
  const float* o;    // [hidden, q_dim]
  const float* post_norm;
  const float* gate_up;  // [2 ffn, hidden]: gate_proj; up_proj
  const float* down;     // [hidden, ffn]
};

struct BlockGrads {
  float* input_norm;
  float* qkv;
  float* o;
  float* post_norm;
  float* gate_up;
  float* down;
  // When set, the k and v rows' gradients ([2 kv_dim, hidden]) accumulate
  // here instead of into qkv: kv heads replicated over TP ranks, whose
  // gradients the model sums over the group before adding them.
  float* kv = nullptr;
};

// Activations of one block, [tokens, width] row-major.
struct BlockActivations {
  float* x_in;   // [T, hidden], block input (the residual stream)
  float* rstd1;  // [T]
  float* h1;     // [T, hidden], normed input
  float* qkv;    // [T, qkv_dim], q and k after RoPE
  float* attn;   // [T, q_dim], attention output before o_proj
  float* lse;    // [batch, heads, seq]
  float* x_mid;  // [T, hidden], residual after attention
  float* rstd2;  // [T]
  float* h2;     // [T, hidden]
  float* gu;     // [T, 2 ffn], gate | up
  float* act;    // [T, ffn], silu(gate) * up
};

struct BlockScratch {
  float* dh;      // [T, hidden]
  float* d_act;   // [T, ffn]
  float* dgu;     // [T, 2 ffn]
  float* d_attn;  // [T, q_dim]
  float* dqkv;    // [T, qkv_dim]
};

// A block's tensor parallelism; BlockForward/BlockBackward take null for one rank.
struct BlockTp {
  TpCollectives* coll = nullptr;
  float* partial = nullptr;  // [tokens, hidden]: a row-parallel GEMM's output, unreduced
  float* rows = nullptr;     // [rows, hidden]: a norm's output before the all-gather
  float* full = nullptr;     // [tokens, hidden]: the all-gathered output gradient
};

// A block's context parallelism (docs/context_parallel.md); null for one rank.
// d.seq is then this rank's 2 chunks of each sequence (zigzag order): RoPE
// takes their global positions and attention is the ring over the CP group.
// The first failed ring operation lands in *status and later rings are skipped.
struct BlockCp {
  RingAttention* ring = nullptr;
  ZigzagSplit split;
  int rank = 0;
  absl::Status* status = nullptr;
};

struct RopeView {
  const float* cos;
  const float* sin;
};

// [moe] A block whose FFN is a mixture of experts (moe_layer.h): the block's
// gate_up/down weights and gu/act activations are then unused.
struct MoeBlock {
  MoeLayer* layer = nullptr;
  MoeDims dims;
  MoeWeights w{};
  MoeGrads g{};
  MoeScratch* scratch = nullptr;
  double loss_scale = 1.0;         // the aux loss's weight in backward
  absl::Status* status = nullptr;  // receives the first failure (an exchange's)
};

kernels::AttentionDims BlockAttentionDims(const BlockDims& d);

// Fills every activation from a.x_in; writes the block output to x_next
// unless it is null (recompute needs everything but the output).
void BlockForward(kernels::Ops& ops, const BlockDims& d, const BlockWeights& w,
                  const RopeView& rope, const BlockActivations& a, float* x_next,
                  const BlockTp* tp = nullptr, const BlockCp* cp = nullptr,
                  const MoeBlock* moe = nullptr);

// The attention core alone: a.attn and a.lse from a.qkv (selective recompute).
// Under CP a.lse is [batch, 2, heads, chunk] (ring_blocks.h), same size.
void BlockAttentionCore(kernels::Ops& ops, const BlockDims& d, const BlockActivations& a,
                        const BlockCp* cp = nullptr);

// On entry dx is dLoss/d(block output); on exit dLoss/d(block input).
// Weight gradients accumulate into g.
void BlockBackward(kernels::Ops& ops, const BlockDims& d, const BlockWeights& w,
                   const BlockGrads& g, const RopeView& rope, const BlockActivations& a,
                   const BlockScratch& s, float* dx, const BlockTp* tp = nullptr,
                   const BlockCp* cp = nullptr, const MoeBlock* moe = nullptr);

}  // namespace loom::engine
