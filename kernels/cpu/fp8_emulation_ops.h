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

#include "kernels/forwarding_ops.h"

namespace loom::kernels::cpu {

class Fp8EmulationOps final : public ForwardingOps {
 public:
  // `inner` does the arithmetic (an fp32 backend on host memory, normally
  // CpuOps); buffers are inner's.
  explicit Fp8EmulationOps(std::unique_ptr<Ops> inner);

  const char* name() const override { return "cpu-fp8-emulation"; }

  GemmScope SetGemmScope(GemmScope scope) override;
  GemmScope gemm_scope() const { return scope_; }
  // GEMMs run on quantized inputs so far (for tests: proves the path ran).
  int64_t quantized_gemms() const { return quantized_gemms_; }

  // In GemmScope::kLinear the operands are fake-quantized first (B is the
  // weight iff A is not transposed, see GemmScope); otherwise plain fp32.
  void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) override;

 private:
  GemmScope scope_ = GemmScope::kDefault;
  int64_t quantized_gemms_ = 0;
};

// The fp8 recipe's CPU backend over CpuOps(num_threads).
std::unique_ptr<Ops> MakeFp8EmulationOps(int num_threads = 0);

}  // namespace loom::kernels::cpu
