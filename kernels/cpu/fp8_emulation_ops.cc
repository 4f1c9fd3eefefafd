#include "kernels/cpu/fp8_emulation_ops.h"

#include <utility>
#include <vector>

#include "kernels/cpu/bf16_emulation_ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fp8_quantize.h"

namespace loom::kernels::cpu {
namespace {

// One quantized operand: the stored matrix (rows x cols with leading
// dimension ld) as fake-quantized dense values.
struct Operand {
  std::vector<float> values;
  int64_t ld = 0;
};

Operand Quantize(const float* x, int64_t rows, int64_t cols, int64_t ld, Fp8Grouping grouping) {
  Operand op;
  op.values.resize(static_cast<size_t>(rows * cols));
  op.ld = cols;
  Fp8RoundTrip(x, rows, cols, ld, grouping, op.values.data());
  return op;
}

}  // namespace

Fp8EmulationOps::Fp8EmulationOps(std::unique_ptr<Ops> inner, std::unique_ptr<Ops> quantized_gemm)
    : ForwardingOps(std::move(inner)), quantized_gemm_(std::move(quantized_gemm)) {}

GemmScope Fp8EmulationOps::SetGemmScope(GemmScope scope) {
  return std::exchange(scope_, scope);
}

void Fp8EmulationOps::Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                           float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                           float beta, float* c, int64_t ldc) {
  if (scope_ != GemmScope::kLinear || m <= 0 || n <= 0 || k <= 0) {
    inner().Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool a_t = trans_a == Transpose::kYes, b_t = trans_b == Transpose::kYes;
  // A is always an activation (x or dy), tiled 1 x 128 along the reduction
  // dimension k: the stored rows when A is [m, k], the stored columns when it
  // is [k, m] (wgrad's dy^T).
  const Operand qa = a_t ? Quantize(a, k, m, lda, Fp8Grouping::kColumnTiles)
                         : Quantize(a, m, k, lda, Fp8Grouping::kRowTiles);
  // B is the weight in forward and dgrad (A not transposed): 128 x 128 blocks
  // of the stored matrix, however the GEMM reads it. In wgrad B is the
  // activation x, tiled along k like A.
  const int64_t b_rows = b_t ? n : k, b_cols = b_t ? k : n;
  Fp8Grouping b_grouping = Fp8Grouping::kBlocks;
  if (a_t) b_grouping = b_t ? Fp8Grouping::kRowTiles : Fp8Grouping::kColumnTiles;
  const Operand qb = Quantize(b, b_rows, b_cols, ldb, b_grouping);
  Ops& gemm = quantized_gemm_ != nullptr ? *quantized_gemm_ : inner();
  gemm.Gemm(trans_a, trans_b, m, n, k, alpha, qa.values.data(), qa.ld, qb.values.data(), qb.ld,
               beta, c, ldc);
  ++quantized_gemms_;
}

std::unique_ptr<Ops> MakeFp8EmulationOps(int num_threads) {
  return std::make_unique<Fp8EmulationOps>(MakeBf16EmulationOps(num_threads),
                                           MakeCpuOps(num_threads));
}

}  // namespace loom::kernels::cpu
