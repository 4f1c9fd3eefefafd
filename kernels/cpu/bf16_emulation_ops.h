// The bf16 recipe on the CPU: an Ops backend that rounds what the GPU's bf16
// recipe (CudaRecipe::kBf16, PyTorch-autocast-like) rounds, and forwards the
// arithmetic to an fp32 backend. It exists so that `train.precision: bf16`
// trains on machines without a GPU with the GPU's numerics, and so that the
// recipe's effect on training is tested everywhere.
//
// What is rounded (bf16, round to nearest even, NaN stays NaN, with the same
// host/device function the CUDA side uses, kernels/cuda/hd/bf16_bits.h):
//  - both inputs of every GEMM, in every GemmScope (the LM head included);
//    products are summed in fp32 and C = alpha * AB + beta * C stays fp32;
//  - attention's inputs (q, k, v; backward also out and d_out) and outputs
//    (out; dq, dk, dv), exactly what CudaOps' attention converts; lse stays
//    fp32.
// What is not: the rounding of the softmax probabilities (and dS) inside the
// bf16 attention kernels before their second matmul, and the GPU's summation
// order. Master weights, gradients, norms, the loss and AdamW stay fp32.
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace loom::kernels::cpu {

class Bf16EmulationOps final : public Ops {
 public:
  // `inner` does the arithmetic (an fp32 backend on host memory, normally
  // CpuOps); buffers are inner's.
  explicit Bf16EmulationOps(std::unique_ptr<Ops> inner);

  DeviceType device() const override { return inner_->device(); }
  const char* name() const override { return "cpu-bf16-emulation"; }
  int num_threads() const override { return inner_->num_threads(); }

  // The scope does not change what this recipe rounds; it is kept so that
  // nested guards restore what they set.
  GemmScope SetGemmScope(GemmScope scope) override;
  // GEMMs and attention calls run on rounded inputs so far (for tests: proves
  // the path ran).
  int64_t rounded_gemms() const { return rounded_gemms_; }
  int64_t rounded_attention_calls() const { return rounded_attention_calls_; }

  void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) override;
  void AttentionForward(const AttentionDims& dims, const float* q, const float* k,
                        const float* v, float* out, float* lse) override;
  void AttentionBackward(const AttentionDims& dims, const float* q, const float* k,
                         const float* v, const float* out, const float* lse, const float* d_out,
                         float* dq, float* dk, float* dv) override;

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
  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int64_t step) override {
    inner_->AdamW(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
  }

 protected:
  // Never called: Allocate hands out inner's buffers, which return to inner.
  void Free(void* data) override {}

 private:
  std::unique_ptr<Ops> inner_;
  GemmScope scope_ = GemmScope::kDefault;
  int64_t rounded_gemms_ = 0;
  int64_t rounded_attention_calls_ = 0;
};

// Rounds rows x cols of x (leading dimension ld) to bf16 values, written
// densely (leading dimension cols) to out. Deterministic.
void RoundToBf16Dense(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out);

// The bf16 recipe's CPU backend over CpuOps(num_threads).
std::unique_ptr<Ops> MakeBf16EmulationOps(int num_threads = 0);

}  // namespace loom::kernels::cpu
