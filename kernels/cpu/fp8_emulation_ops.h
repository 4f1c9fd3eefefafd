// The fp8 recipe on the CPU: an Ops backend that runs the linear layers'
// GEMMs (GemmScope::kLinear: forward, data gradient, weight gradient) on
// FP8-quantized inputs, DeepSeek-V3 style, and forwards everything else to an
// fp32 backend unchanged. It exists so the recipe's numerics (what e4m3 with
// 1x128 activation tiles and 128x128 weight blocks does to training) are
// tested on machines without a GPU.
//
// What is emulated: the quantization of both GEMM inputs, bit-exact with the
// CUDA quantizers (activations in 1 x 128 tiles along the reduction
// dimension, weights in 128 x 128 blocks of the stored [out, in] matrix, fp32
// scales amax / 448, e4m3 round-to-nearest-even with saturation). What is
// not: Hopper's reduced-precision tensor-core accumulator (the products are
// summed in fp32 by OpenBLAS, which is what promoting every 128 of K achieves
// on the GPU) and the bf16 rounding of the GEMM output (outputs, residual
// adds and weight-gradient accumulation stay fp32, with fp32 master weights
// and optimizer states). Attention, norms, the LM head and the loss are fp32.
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace loom::kernels::cpu {

class Fp8EmulationOps final : public Ops {
 public:
  // `inner` does the arithmetic (an fp32 backend on host memory, normally
  // CpuOps); buffers are inner's.
  explicit Fp8EmulationOps(std::unique_ptr<Ops> inner);

  DeviceType device() const override { return inner_->device(); }
  const char* name() const override { return "cpu-fp8-emulation"; }
  int num_threads() const override { return inner_->num_threads(); }

  GemmScope SetGemmScope(GemmScope scope) override;
  GemmScope gemm_scope() const { return scope_; }
  // GEMMs run on quantized inputs so far (for tests: proves the path ran).
  int64_t quantized_gemms() const { return quantized_gemms_; }

  // In GemmScope::kLinear the operands are fake-quantized first (B is the
  // weight iff A is not transposed, see GemmScope); otherwise plain fp32.
  void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) override;

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
  int64_t quantized_gemms_ = 0;
};

// The fp8 recipe's CPU backend over CpuOps(num_threads).
std::unique_ptr<Ops> MakeFp8EmulationOps(int num_threads = 0);

}  // namespace loom::kernels::cpu
