// The CPU backend's kernels as free functions on host fp32 arrays; CpuOps
// (cpu_ops.h) forwards the Ops interface to these. Exposed separately so the
// kernel benchmarks can call them without a backend object. Semantics are
// those of the matching Ops methods in kernels/ops.h.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace loom::kernels::cpu {

void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);

void AttentionForward(const AttentionDims& dims, const float* q, const float* k, const float* v,
                      float* out, float* lse);
void AttentionBackward(const AttentionDims& dims, const float* q, const float* k, const float* v,
                       const float* out, const float* lse, const float* d_out, float* dq,
                       float* dk, float* dv);
void AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                    int64_t out_row_stride, float* lse, const float* block_out,
                    int64_t block_row_stride, const float* block_lse);

void EmbeddingForward(const int32_t* ids, int64_t num_tokens, const float* table, int64_t vocab,
                      int64_t dim, float* out);
void EmbeddingBackward(const int32_t* ids, int64_t num_tokens, const float* d_out, int64_t vocab,
                       int64_t dim, float* d_table);

void RmsNormForward(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                    float* y, float* rstd);
void RmsNormBackward(const float* d_y, const float* x, const float* weight, const float* rstd,
                     int64_t rows, int64_t dim, float* dx, bool accumulate_dx, float* d_weight);

void RopeApply(float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
               int64_t row_stride, const float* cos, const float* sin, int64_t position_offset,
               bool inverse);

void SwiGluForward(int64_t rows, int64_t dim, const float* gate, const float* up,
                   int64_t in_stride, float* out, int64_t out_stride);
void SwiGluBackward(int64_t rows, int64_t dim, const float* gate, const float* up,
                    int64_t in_stride, const float* d_out, int64_t out_stride, float* d_gate,
                    float* d_up);

// With backward, logits are overwritten in place by grad_scale * dloss/dlogits.
void CrossEntropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                  bool backward, float grad_scale, float* row_loss);

// Vocabulary-parallel embedding and cross-entropy (vocab_parallel.cc).
void EmbeddingShardForward(const int32_t* ids, int64_t num_tokens, const float* table,
                           int64_t vocab_offset, int64_t vocab, int64_t dim, float* out);
void EmbeddingShardBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                            int64_t vocab_offset, int64_t vocab, int64_t dim, float* d_table);
void CrossEntropyShardStats(const float* logits, const int32_t* targets, int64_t rows,
                            int64_t vocab_offset, int64_t vocab, float* row_lse,
                            float* row_target_logit);
void CrossEntropyShardBackward(float* logits, const int32_t* targets, int64_t rows,
                               int64_t vocab_offset, int64_t vocab, const float* row_lse,
                               float grad_scale);

double SumSquares(const float* x, int64_t n);

// Mixture of experts (kernels/cpu/moe.cc; Ops::MoeRoute and the rest).
void MoeRoute(const MoeRouteDims& d, const float* logits, const float* bias, int32_t* expert,
              float* weight, float* scores, float* probs, int32_t* row_of, int32_t* assignment_of,
              int64_t* counts, double* prob_sum);
void MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                const int32_t* assignment_of, const float* weight, float* out);
void MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                  const int32_t* row_of, const float* weight, float* out);
void MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy, const float* rows,
                 const int32_t* row_of, float* d_weight);
void MoeRouterBackward(const MoeRouteDims& d, const int32_t* expert, const float* weight,
                       const float* scores, const float* probs, const int64_t* counts,
                       const float* d_weight, double aux_scale, float* d_logits);

}  // namespace loom::kernels::cpu
