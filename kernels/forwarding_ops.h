// An Ops backend that hands every call to another backend, for backends that
// change a few ops and keep the rest (the CPU's bf16 and fp8 recipe
// emulations): they derive from it and override only what they change.
// Buffers are the inner backend's (they return to it when released).
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "kernels/ops.h"

namespace loom::kernels {

class ForwardingOps : public Ops {
 public:
  explicit ForwardingOps(std::unique_ptr<Ops> inner) : inner_(std::move(inner)) {}

  DeviceType device() const override { return inner_->device(); }
  const char* name() const override { return inner_->name(); }
  int num_threads() const override { return inner_->num_threads(); }
  GemmScope SetGemmScope(GemmScope scope) override { return inner_->SetGemmScope(scope); }
  std::optional<DeviceMemoryStats> device_memory() const override { return inner_->device_memory(); }
  void ResetPeakDeviceMemory() override { inner_->ResetPeakDeviceMemory(); }

  void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) override {
    inner_->Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  Buffer Allocate(int64_t bytes) override { return inner_->Allocate(bytes); }
  void CopyHostToDevice(void* dst, const void* src, int64_t bytes) override {
    inner_->CopyHostToDevice(dst, src, bytes);
  }
  void CopyDeviceToHost(void* dst, const void* src, int64_t bytes) override {
    inner_->CopyDeviceToHost(dst, src, bytes);
  }
  void CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) override {
    inner_->CopyDeviceToDevice(dst, src, bytes);
  }
  void Fill(float* x, int64_t n, float value) override { inner_->Fill(x, n, value); }
  void Synchronize() override { inner_->Synchronize(); }

  void Axpy(int64_t n, float alpha, const float* x, float* y) override {
    inner_->Axpy(n, alpha, x, y);
  }
  void Scale(int64_t n, float alpha, float* x) override { inner_->Scale(n, alpha, x); }
  double SumSquares(const float* x, int64_t n) override { return inner_->SumSquares(x, n); }

  void EmbeddingForward(const int32_t* ids, int64_t num_tokens, const float* table, int64_t vocab,
                        int64_t dim, float* out) override {
    inner_->EmbeddingForward(ids, num_tokens, table, vocab, dim, out);
  }
  void EmbeddingBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                         int64_t vocab, int64_t dim, float* d_table) override {
    inner_->EmbeddingBackward(ids, num_tokens, d_out, vocab, dim, d_table);
  }
  void RmsNormForward(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                      float* y, float* rstd) override {
    inner_->RmsNormForward(x, weight, rows, dim, eps, y, rstd);
  }
  void RmsNormBackward(const float* d_y, const float* x, const float* weight, const float* rstd,
                       int64_t rows, int64_t dim, float* dx, bool accumulate_dx,
                       float* d_weight) override {
    inner_->RmsNormBackward(d_y, x, weight, rstd, rows, dim, dx, accumulate_dx, d_weight);
  }
  void RopeForward(float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                   int64_t row_stride, const float* cos, const float* sin,
                   int64_t position_offset) override {
    inner_->RopeForward(x, batch, seq, heads, head_dim, row_stride, cos, sin, position_offset);
  }
  void RopeBackward(float* dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                    int64_t row_stride, const float* cos, const float* sin,
                    int64_t position_offset) override {
    inner_->RopeBackward(dx, batch, seq, heads, head_dim, row_stride, cos, sin, position_offset);
  }
  void SwiGluForward(int64_t rows, int64_t dim, const float* gate, const float* up,
                     int64_t in_stride, float* out, int64_t out_stride) override {
    inner_->SwiGluForward(rows, dim, gate, up, in_stride, out, out_stride);
  }
  void SwiGluBackward(int64_t rows, int64_t dim, const float* gate, const float* up,
                      int64_t in_stride, const float* d_out, int64_t out_stride, float* d_gate,
                      float* d_up) override {
    inner_->SwiGluBackward(rows, dim, gate, up, in_stride, d_out, out_stride, d_gate, d_up);
  }
  void AttentionForward(const AttentionDims& dims, const float* q, const float* k,
                        const float* v, float* out, float* lse) override {
    inner_->AttentionForward(dims, q, k, v, out, lse);
  }
  void AttentionBackward(const AttentionDims& dims, const float* q, const float* k,
                         const float* v, const float* out, const float* lse, const float* d_out,
                         float* dq, float* dk, float* dv) override {
    inner_->AttentionBackward(dims, q, k, v, out, lse, d_out, dq, dk, dv);
  }
  void AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                      int64_t out_row_stride, float* lse, const float* block_out,
                      int64_t block_row_stride, const float* block_lse) override {
    inner_->AttentionMerge(seq, heads, head_dim, out, out_row_stride, lse, block_out,
                           block_row_stride, block_lse);
  }
  void CopyRows(int64_t rows, int64_t cols, const float* src, int64_t src_stride, float* dst,
                int64_t dst_stride) override {
    inner_->CopyRows(rows, cols, src, src_stride, dst, dst_stride);
  }
  void CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                           int64_t vocab, float* row_loss) override {
    inner_->CrossEntropyForward(logits, targets, rows, vocab, row_loss);
  }
  void CrossEntropyForwardBackward(float* logits, const int32_t* targets, int64_t rows,
                                   int64_t vocab, float grad_scale, float* row_loss) override {
    inner_->CrossEntropyForwardBackward(logits, targets, rows, vocab, grad_scale, row_loss);
  }
  void EmbeddingShardForward(const int32_t* ids, int64_t num_tokens, const float* table,
                             int64_t vocab_offset, int64_t vocab, int64_t dim,
                             float* out) override {
    inner_->EmbeddingShardForward(ids, num_tokens, table, vocab_offset, vocab, dim, out);
  }
  void EmbeddingShardBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                              int64_t vocab_offset, int64_t vocab, int64_t dim,
                              float* d_table) override {
    inner_->EmbeddingShardBackward(ids, num_tokens, d_out, vocab_offset, vocab, dim, d_table);
  }
  void CrossEntropyShardStats(const float* logits, const int32_t* targets, int64_t rows,
                              int64_t vocab_offset, int64_t vocab, float* row_lse,
                              float* row_target_logit) override {
    inner_->CrossEntropyShardStats(logits, targets, rows, vocab_offset, vocab, row_lse,
                                   row_target_logit);
  }
  void CrossEntropyShardBackward(float* logits, const int32_t* targets, int64_t rows,
                                 int64_t vocab_offset, int64_t vocab, const float* row_lse,
                                 float grad_scale) override {
    inner_->CrossEntropyShardBackward(logits, targets, rows, vocab_offset, vocab, row_lse,
                                      grad_scale);
  }
  void MoeRoute(const MoeRouteDims& d, const float* logits, const float* bias, int32_t* expert,
                float* weight, float* scores, float* probs, int32_t* row_of,
                int32_t* assignment_of, int64_t* counts, double* prob_sum) override {
    inner_->MoeRoute(d, logits, bias, expert, weight, scores, probs, row_of, assignment_of, counts,
                     prob_sum);
  }
  void MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                  const int32_t* assignment_of, const float* weight, float* out) override {
    inner_->MoePermute(rows, top_k, width, x, assignment_of, weight, out);
  }
  void MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                    const int32_t* row_of, const float* weight, float* out) override {
    inner_->MoeUnpermute(tokens, top_k, width, in, row_of, weight, out);
  }
  void MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy,
                   const float* rows, const int32_t* row_of, float* d_weight) override {
    inner_->MoeGateGrad(tokens, top_k, width, dy, rows, row_of, d_weight);
  }
  void MoeRouterBackward(const MoeRouteDims& d, const int32_t* expert, const float* weight,
                         const float* scores, const float* probs, const int64_t* counts,
                         const float* d_weight, double aux_scale, float* d_logits) override {
    inner_->MoeRouterBackward(d, expert, weight, scores, probs, counts, d_weight, aux_scale,
                              d_logits);
  }
  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int64_t step) override {
    inner_->AdamW(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
  }

 protected:
  Ops& inner() { return *inner_; }
  // Never called: Allocate hands out inner's buffers, which return to inner.
  void Free(void* data) override {}

 private:
  std::unique_ptr<Ops> inner_;
};

}  // namespace loom::kernels
