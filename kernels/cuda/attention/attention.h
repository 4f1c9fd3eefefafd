// Fused attention for Hopper in the FlashAttention-2 manner: bf16 q/k/v,
// fp32 accumulation, tiles in shared memory and registers, online softmax, no
// score or probability matrix in global memory. Causal or full, grouped-query,
// head dims 64 and 128. Shapes, layouts, strides, masking and the GQA rule are
// those of kernels/ops.h's AttentionDims (q/k/v/out [batch, seq, heads,
// head_dim] with token strides; lse [batch, num_heads, seq_q], natural log).
//
// Launchers return cudaSuccess or the first error (invalid dims included:
// cudaErrorInvalidValue); they only enqueue work on `stream`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/ops.h"

namespace loom::kernels::cuda {

// A row whose keys are all masked (possible only with q_offset < kv_offset)
// gets out = 0 and lse = +inf, so the backward pass sees P = 0 there.
// block_m picks the forward tile height (64 or 128; 0 = default) for the dev
// benchmark of variants.
cudaError_t AttentionForward(const AttentionDims& dims, const __nv_bfloat16* q,
                             const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* out,
                             float* lse, cudaStream_t stream, int block_m = 0);

// Scratch for the backward pass: fp32 dq accumulator and rowsum(dO * O).
size_t AttentionBackwardWorkspaceBytes(const AttentionDims& dims);

// Overwrites dq, dk, dv (dk/dv summed over each group's query heads). d_out
// and out use o_row_stride; dq uses q_row_stride, dk k_row_stride, dv
// v_row_stride. `workspace` holds AttentionBackwardWorkspaceBytes bytes.
cudaError_t AttentionBackward(const AttentionDims& dims, const __nv_bfloat16* q,
                              const __nv_bfloat16* k, const __nv_bfloat16* v,
                              const __nv_bfloat16* out, const float* lse,
                              const __nv_bfloat16* d_out, __nv_bfloat16* dq, __nv_bfloat16* dk,
                              __nv_bfloat16* dv, void* workspace, cudaStream_t stream);

}  // namespace loom::kernels::cuda
