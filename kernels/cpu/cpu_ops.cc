#include "kernels/cpu/cpu_ops.h"

#include <cblas.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/cpu_kernels.h"

namespace loom::kernels::cpu {

CpuOps::CpuOps(int num_threads) {
  num_threads_ = num_threads > 0 ? num_threads : omp_get_max_threads();
  omp_set_num_threads(num_threads_);
  // GEMMs are threaded by gemm.cc over OpenMP; OpenBLAS itself stays serial.
  openblas_set_num_threads(1);
}

Buffer CpuOps::Allocate(int64_t bytes) {
  // 64-byte alignment: whole cache lines and aligned AVX-512 loads.
  const size_t size = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  void* p = size == 0 ? nullptr : std::aligned_alloc(64, size);
  if (size != 0 && p == nullptr) throw std::bad_alloc();
  return Buffer(this, p, bytes);
}

void CpuOps::Free(void* data) { std::free(data); }

void CpuOps::CopyHostToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}
void CpuOps::CopyDeviceToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}
void CpuOps::CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
}

void CpuOps::Fill(float* x, int64_t n, float value) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

void CpuOps::Axpy(int64_t n, float alpha, const float* x, float* y) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void CpuOps::Scale(int64_t n, float alpha, float* x) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

double CpuOps::SumSquares(const float* x, int64_t n) { return cpu::SumSquares(x, n); }

void CpuOps::Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                  float beta, float* c, int64_t ldc) {
  cpu::Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CpuOps::EmbeddingForward(const int32_t* ids, int64_t num_tokens, const float* table,
                              int64_t vocab, int64_t dim, float* out) {
  cpu::EmbeddingForward(ids, num_tokens, table, vocab, dim, out);
}
void CpuOps::EmbeddingBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                               int64_t vocab, int64_t dim, float* d_table) {
  cpu::EmbeddingBackward(ids, num_tokens, d_out, vocab, dim, d_table);
}

void CpuOps::RmsNormForward(const float* x, const float* weight, int64_t rows, int64_t dim,
                            float eps, float* y, float* rstd) {
  cpu::RmsNormForward(x, weight, rows, dim, eps, y, rstd);
}
void CpuOps::RmsNormBackward(const float* d_y, const float* x, const float* weight,
                             const float* rstd, int64_t rows, int64_t dim, float* dx,
                             bool accumulate_dx, float* d_weight) {
  cpu::RmsNormBackward(d_y, x, weight, rstd, rows, dim, dx, accumulate_dx, d_weight);
}

void CpuOps::RopeForward(float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                         int64_t row_stride, const float* cos, const float* sin,
                         int64_t position_offset) {
  RopeApply(x, batch, seq, heads, head_dim, row_stride, cos, sin, position_offset, false);
}
void CpuOps::RopeBackward(float* dx, int64_t batch, int64_t seq, int64_t heads,
                          int64_t head_dim, int64_t row_stride, const float* cos,
                          const float* sin, int64_t position_offset) {
  RopeApply(dx, batch, seq, heads, head_dim, row_stride, cos, sin, position_offset, true);
}

void CpuOps::SwiGluForward(int64_t rows, int64_t dim, const float* gate, const float* up,
                           int64_t in_stride, float* out, int64_t out_stride) {
  cpu::SwiGluForward(rows, dim, gate, up, in_stride, out, out_stride);
}
void CpuOps::SwiGluBackward(int64_t rows, int64_t dim, const float* gate, const float* up,
                            int64_t in_stride, const float* d_out, int64_t out_stride,
                            float* d_gate, float* d_up) {
  cpu::SwiGluBackward(rows, dim, gate, up, in_stride, d_out, out_stride, d_gate, d_up);
}

void CpuOps::AttentionForward(const AttentionDims& dims, const float* q, const float* k,
                              const float* v, float* out, float* lse) {
  cpu::AttentionForward(dims, q, k, v, out, lse);
}
void CpuOps::AttentionBackward(const AttentionDims& dims, const float* q, const float* k,
                               const float* v, const float* out, const float* lse,
                               const float* d_out, float* dq, float* dk, float* dv) {
  cpu::AttentionBackward(dims, q, k, v, out, lse, d_out, dq, dk, dv);
}
void CpuOps::AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                            int64_t out_row_stride, float* lse, const float* block_out,
                            int64_t block_row_stride, const float* block_lse) {
  cpu::AttentionMerge(seq, heads, head_dim, out, out_row_stride, lse, block_out,
                      block_row_stride, block_lse);
}
void CpuOps::CopyRows(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                      float* dst, int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * src_stride, cols * sizeof(float));
  }
}

void CpuOps::CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                                 int64_t vocab, float* row_loss) {
  // The forward-only path never writes the logits.
  cpu::CrossEntropy(const_cast<float*>(logits), targets, rows, vocab, false, 0.0f, row_loss);
}
void CpuOps::CrossEntropyForwardBackward(float* logits, const int32_t* targets, int64_t rows,
                                         int64_t vocab, float grad_scale, float* row_loss) {
  cpu::CrossEntropy(logits, targets, rows, vocab, true, grad_scale, row_loss);
}

void CpuOps::EmbeddingShardForward(const int32_t* ids, int64_t num_tokens, const float* table,
                                   int64_t vocab_offset, int64_t vocab, int64_t dim,
                                   float* out) {
  cpu::EmbeddingShardForward(ids, num_tokens, table, vocab_offset, vocab, dim, out);
}
void CpuOps::EmbeddingShardBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                                    int64_t vocab_offset, int64_t vocab, int64_t dim,
                                    float* d_table) {
  cpu::EmbeddingShardBackward(ids, num_tokens, d_out, vocab_offset, vocab, dim, d_table);
}
void CpuOps::CrossEntropyShardStats(const float* logits, const int32_t* targets, int64_t rows,
                                    int64_t vocab_offset, int64_t vocab, float* row_lse,
                                    float* row_target_logit) {
  cpu::CrossEntropyShardStats(logits, targets, rows, vocab_offset, vocab, row_lse,
                              row_target_logit);
}
void CpuOps::CrossEntropyShardBackward(float* logits, const int32_t* targets, int64_t rows,
                                       int64_t vocab_offset, int64_t vocab,
                                       const float* row_lse, float grad_scale) {
  cpu::CrossEntropyShardBackward(logits, targets, rows, vocab_offset, vocab, row_lse,
                                 grad_scale);
}

void CpuOps::AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  AdamWStep(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
}

void CpuOps::MoeRoute(const MoeRouteDims& d, const float* logits, const float* bias,
                      int32_t* expert, float* weight, float* scores, float* probs,
                      int32_t* row_of, int32_t* assignment_of, int64_t* counts,
                      double* prob_sum) {
  cpu::MoeRoute(d, logits, bias, expert, weight, scores, probs, row_of, assignment_of, counts,
                prob_sum);
}
void CpuOps::MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                        const int32_t* assignment_of, const float* weight, float* out) {
  cpu::MoePermute(rows, top_k, width, x, assignment_of, weight, out);
}
void CpuOps::MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                          const int32_t* row_of, const float* weight, float* out) {
  cpu::MoeUnpermute(tokens, top_k, width, in, row_of, weight, out);
}
void CpuOps::MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy,
                         const float* rows, const int32_t* row_of, float* d_weight) {
  cpu::MoeGateGrad(tokens, top_k, width, dy, rows, row_of, d_weight);
}
void CpuOps::MoeRouterBackward(const MoeRouteDims& d, const int32_t* expert, const float* weight,
                               const float* scores, const float* probs, const int64_t* counts,
                               const float* d_weight, double aux_scale, float* d_logits) {
  cpu::MoeRouterBackward(d, expert, weight, scores, probs, counts, d_weight, aux_scale, d_logits);
}

std::unique_ptr<Ops> MakeCpuOps(int num_threads) { return std::make_unique<CpuOps>(num_threads); }

}  // namespace loom::kernels::cpu
