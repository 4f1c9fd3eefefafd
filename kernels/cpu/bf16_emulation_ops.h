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

#include "kernels/forwarding_ops.h"

namespace loom::kernels::cpu {

class Bf16EmulationOps final : public ForwardingOps {
 public:
  // `inner` does the arithmetic (an fp32 backend on host memory, normally
  // CpuOps); buffers are inner's.
  explicit Bf16EmulationOps(std::unique_ptr<Ops> inner);

  const char* name() const override { return "cpu-bf16-emulation"; }

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

 private:
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
