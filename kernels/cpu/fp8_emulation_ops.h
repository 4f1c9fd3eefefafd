// The fp8 recipe on the CPU: an Ops backend that runs the linear layers'
// GEMMs (GemmScope::kLinear: forward, data gradient, weight gradient) on
// FP8-quantized inputs, DeepSeek-V3 style, and forwards everything else to an
// inner backend (in the shipped recipe, MakeFp8EmulationOps, the bf16
// emulation). It exists so the recipe's numerics (what e4m3 with
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
// and optimizer states). The LM head's GEMMs and attention run as the inner
// backend runs them (bf16-rounded operands in MakeFp8EmulationOps, as on the
// GPU); norms and the loss are fp32.
#pragma once

#include <memory>

#include "kernels/forwarding_ops.h"

namespace loom::kernels::cpu {

class Fp8EmulationOps final : public ForwardingOps {
 public:
  // `inner` runs everything outside the linear layers' GEMMs (the recipe's
  // higher-precision part: the bf16 emulation, as CudaOps' kFp8 runs those
  // in bf16; or plain CpuOps); `quantized_gemm` multiplies the fake-quantized
  // operands in fp32 (an fp32 host backend; null: inner). Buffers are inner's.
  explicit Fp8EmulationOps(std::unique_ptr<Ops> inner,
                           std::unique_ptr<Ops> quantized_gemm = nullptr);

  const char* name() const override { return "cpu-fp8-emulation"; }

  GemmScope SetGemmScope(GemmScope scope) override;
  GemmScope gemm_scope() const { return scope_; }
  // GEMMs run on quantized inputs so far (for tests: proves the path ran).
  int64_t quantized_gemms() const { return quantized_gemms_; }

  // In GemmScope::kLinear the operands are fake-quantized first (B is the
  // weight iff A is not transposed, see GemmScope); otherwise inner's GEMM.
  void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) override;

 private:
  std::unique_ptr<Ops> quantized_gemm_;
  GemmScope scope_ = GemmScope::kDefault;
  int64_t quantized_gemms_ = 0;
};

// The fp8 recipe's CPU backend as train.precision=fp8 runs it: the linear
// layers' GEMMs on e4m3-quantized operands (multiplied by CpuOps), the rest
// through the bf16 emulation (kernels/cpu/bf16_emulation_ops.h), which is
// what CudaOps' kFp8 computes.
std::unique_ptr<Ops> MakeFp8EmulationOps(int num_threads = 0);

}  // namespace loom::kernels::cpu
