// Plain CUDA kernels for the ops of kernels/ops.h that have no tuned kernel in
// kernels/cuda/ops/ yet (fill, axpy, scale, sum of squares, embeddings, the
// vocabulary-parallel cross-entropy pieces) and the fp32 <-> bf16 conversions
// around the bf16 attention kernels. Correct and deterministic first, fast
// later: reductions run in a fixed order, embedding gradients add tokens in
// order (one thread per column). Launchers enqueue on `stream` and return the
// launch status; invalid sizes give cudaErrorInvalidValue.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda::simple {

cudaError_t Fill(float* x, int64_t n, float value, cudaStream_t stream);
cudaError_t Axpy(int64_t n, float alpha, const float* x, float* y, cudaStream_t stream);
cudaError_t Scale(int64_t n, float alpha, float* x, cudaStream_t stream);
// *result (device, one double) = sum of x[i]^2, reduced in double in a fixed
// order by one block.
cudaError_t SumSquares(const float* x, int64_t n, double* result, cudaStream_t stream);

// Rows of [rows, cols] matrices with element strides.
cudaError_t FloatToBf16(const float* src, int64_t src_stride, int64_t rows, int64_t cols,
                        __nv_bfloat16* dst, int64_t dst_stride, cudaStream_t stream);
cudaError_t Bf16ToFloat(const __nv_bfloat16* src, int64_t src_stride, int64_t rows,
                        int64_t cols, float* dst, int64_t dst_stride, cudaStream_t stream);

// dst = alpha * src + beta * dst over rows x cols with element strides; with
// beta == 0 dst is not read (BLAS semantics: NaNs in dst do not survive). The
// epilogue of GEMMs computed into scratch.
cudaError_t ScaleAdd(int64_t rows, int64_t cols, float alpha, const float* src,
                     int64_t src_stride, float beta, float* dst, int64_t dst_stride,
                     cudaStream_t stream);

// Ring attention's log-sum-exp merge (Ops::AttentionMerge), in place on out and lse.
cudaError_t AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                           int64_t out_row_stride, float* lse, const float* block_out,
                           int64_t block_row_stride, const float* block_lse,
                           cudaStream_t stream);

// Token rows whose id is outside [vocab_offset, vocab_offset + vocab) get
// zeros (forward) or are skipped (backward); the unsharded ops pass offset 0,
// where an out-of-range id is a caller bug and also gives zeros.
cudaError_t EmbeddingForward(const int32_t* ids, int64_t num_tokens, const float* table,
                             int64_t vocab_offset, int64_t vocab, int64_t dim, float* out,
                             cudaStream_t stream);
// ACCUMULATES into d_table, tokens in order.
cudaError_t EmbeddingBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                              int64_t vocab_offset, int64_t vocab, int64_t dim, float* d_table,
                              cudaStream_t stream);

cudaError_t CrossEntropyShardStats(const float* logits, const int32_t* targets, int64_t rows,
                                   int64_t vocab_offset, int64_t vocab, float* row_lse,
                                   float* row_target_logit, cudaStream_t stream);
cudaError_t CrossEntropyShardBackward(float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab_offset, int64_t vocab, const float* row_lse,
                                      float grad_scale, cudaStream_t stream);

}  // namespace loom::kernels::cuda::simple
