// CudaOps' fp8 recipe: a GEMM of GemmScope::kLinear on the block-scaled FP8
// kernels of kernels/cuda/fp8, planned by fp8_gemm_plan.h (operand roles,
// quantizers, zero padding to multiples of 128: see there) so that the
// operands hold exactly the values the CPU emulation
// (kernels/cpu/fp8_emulation_ops.cc) multiplies. The GEMM writes its fp32
// totals into scratch; C = alpha * D + beta * C follows, so C, alpha and beta
// behave as in every other recipe.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/cuda/backend/cuda_ops.h"
#include "kernels/cuda/backend/fp8_gemm_plan.h"
#include "kernels/cuda/backend/simple_kernels.h"
#include "kernels/cuda/fp8/fp8.h"
#include "kernels/cuda/hd/fp8_e4m3.h"

namespace loom::kernels::cuda {

bool CudaOps::GemmFp8(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                      float beta, float* c, int64_t ldc) {
  const Fp8GemmPlan plan = PlanFp8Gemm(trans_a, trans_b, m, n, k);
  if (!plan.supported) return false;
  const std::string what = "Gemm (fp8, m=" + std::to_string(m) + " n=" + std::to_string(n) +
                           " k=" + std::to_string(k) + ")";
  const int64_t f32 = static_cast<int64_t>(sizeof(float));

  // The stored operand, dense and zero-padded: the caller's pointer itself
  // when it already is.
  auto padded = [&](const float* x, int64_t ld, const Fp8OperandPlan& op,
                    Buffer* holder) -> const float* {
    if (op.rows == op.padded_rows && op.cols == op.padded_cols && ld == op.cols) return x;
    const int64_t bytes = op.padded_rows * op.padded_cols * f32;
    *holder = Scratch(bytes, what.c_str());
    if (holder->empty()) return nullptr;
    if (!Check(cudaMemsetAsync(holder->data(), 0, static_cast<size_t>(bytes), stream_),
               what.c_str()) ||
        !Check(cudaMemcpy2DAsync(holder->data(), static_cast<size_t>(op.padded_cols * f32), x,
                                 static_cast<size_t>(ld * f32), static_cast<size_t>(op.cols * f32),
                                 static_cast<size_t>(op.rows), cudaMemcpyDeviceToDevice, stream_),
               what.c_str()))
      return nullptr;
    return holder->f32();
  };
  auto quantize = [&](const float* x, const Fp8OperandPlan& op, uint8_t* codes, float* scales) {
    const int rows = static_cast<int>(op.padded_rows), cols = static_cast<int>(op.padded_cols);
    return op.weight ? QuantizeWeightFp8(x, rows, cols, op.transpose, codes, scales, stream_)
                     : QuantizeActivationFp8(x, rows, cols, op.transpose, codes, scales, stream_);
  };

  Buffer a_pad, b_pad;
  const float* ap = padded(a, lda, plan.a, &a_pad);
  const float* bp = padded(b, ldb, plan.b, &b_pad);
  if (ap == nullptr || bp == nullptr) return true;  // error recorded

  // Codes [m, k] and [n, k]; scales at most [k/128, rows] floats (tiles),
  // fewer for blocks.
  Buffer a_codes = Scratch(plan.m * plan.k, what.c_str());
  Buffer b_codes = Scratch(plan.n * plan.k, what.c_str());
  Buffer a_scales = Scratch(plan.k / kFp8Tile * plan.m * f32, what.c_str());
  Buffer b_scales = Scratch(plan.k / kFp8Tile * plan.n * f32, what.c_str());
  Buffer d = Scratch(plan.m * plan.n * f32, what.c_str());
  for (const Buffer* buffer : {&a_codes, &b_codes, &a_scales, &b_scales, &d})
    if (buffer->empty()) return true;
  auto* qa = static_cast<uint8_t*>(a_codes.data());
  auto* qb = static_cast<uint8_t*>(b_codes.data());
  if (!Check(quantize(ap, plan.a, qa, a_scales.f32()), (what + ": quantizing A").c_str()) ||
      !Check(quantize(bp, plan.b, qb, b_scales.f32()), (what + ": quantizing B").c_str()))
    return true;
  const Fp8BScales b_layout =
      plan.b_tile_scales ? Fp8BScales::kTile1x128 : Fp8BScales::kBlock128x128;
  if (!Check(Fp8BlockScaledGemm(qa, a_scales.f32(), qb, b_scales.f32(), b_layout,
                                static_cast<int>(plan.m), static_cast<int>(plan.n),
                                static_cast<int>(plan.k), d.f32(), stream_),
             what.c_str()))
    return true;
  Check(simple::ScaleAdd(m, n, alpha, d.f32(), plan.n, beta, c, ldc, stream_),
        (what + ": epilogue").c_str());
  return true;
}

}  // namespace loom::kernels::cuda
