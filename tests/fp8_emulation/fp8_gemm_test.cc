// The fp8 emulation's quantizer and GEMM against the FP8 reference that
// defines the CUDA kernels' layouts (kernels/cuda/reference/fp8_reference.h):
// the fake-quantized operands must hold exactly the reference's code * scale,
// and a linear-scope GEMM must equal the reference block-scaled GEMM (to fp32
// summation order) for the forward, dgrad and wgrad shapes, ragged tiles and
// strided operands included. Outside the linear scope the GEMM is plain fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cpu/bf16_emulation_ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fp8_emulation_ops.h"
#include "kernels/cpu/fp8_quantize.h"
#include "kernels/cuda/reference/fp8_reference.h"

namespace loom::kernels::cpu {
namespace {

namespace ref = cuda::reference;

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  // A few outliers so that tiles have different scales and some saturate
  // nothing but others' small values fall into e4m3's subnormals.
  for (size_t i = 0; i < v.size(); i += 97) v[i] *= 40.0f;
  return v;
}

// The reference's values of a quantized tensor, [rows, cols] K-major.
std::vector<float> Dequantized(const ref::Fp8Tensor& t, bool activation) {
  std::vector<float> out(t.codes.size());
  const int kb_count = cuda::CeilDiv(t.cols, cuda::kFp8Tile);
  for (int r = 0; r < t.rows; ++r)
    for (int c = 0; c < t.cols; ++c) {
      const int kb = c / cuda::kFp8Tile;
      const float s = activation ? t.scales[static_cast<size_t>(kb) * t.rows + r]
                                 : t.scales[static_cast<size_t>(r / cuda::kFp8Tile) * kb_count + kb];
      out[static_cast<size_t>(r) * t.cols + c] =
          cuda::E4m3ToFloat(t.codes[static_cast<size_t>(r) * t.cols + c]) * s;
    }
  return out;
}

TEST(Fp8Quantize, RowTilesEqualReferenceActivation) {
  const int rows = 5, cols = 300;  // 128 + 128 + 44: a short last tile
  std::vector<float> x = Random(rows * cols, 1);
  std::vector<float> ours(x.size());
  Fp8RoundTrip(x.data(), rows, cols, cols, Fp8Grouping::kRowTiles, ours.data());
  const ref::Fp8Tensor t = ref::QuantizeActivation(x.data(), rows, cols, false);
  EXPECT_EQ(ours, Dequantized(t, true));
}

TEST(Fp8Quantize, ColumnTilesEqualReferenceOfTranspose) {
  const int rows = 200, cols = 7;
  std::vector<float> x = Random(rows * cols, 2);
  std::vector<float> ours(x.size());
  Fp8RoundTrip(x.data(), rows, cols, cols, Fp8Grouping::kColumnTiles, ours.data());
  // The reference quantizes x^T [cols, rows] along its rows.
  const ref::Fp8Tensor t = ref::QuantizeActivation(x.data(), rows, cols, true);
  const std::vector<float> expect_t = Dequantized(t, true);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      ASSERT_EQ(ours[r * cols + c], expect_t[c * rows + r]) << r << "," << c;
}

TEST(Fp8Quantize, BlocksEqualReferenceWeightWithStride) {
  const int rows = 260, cols = 150, ld = 170;
  std::vector<float> x = Random(rows * ld, 3, 0.05f);
  std::vector<float> ours(static_cast<size_t>(rows) * cols);
  Fp8RoundTrip(x.data(), rows, cols, ld, Fp8Grouping::kBlocks, ours.data());
  std::vector<float> dense(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dense[r * cols + c] = x[r * ld + c];
  const ref::Fp8Tensor t = ref::QuantizeWeight(dense.data(), rows, cols, false);
  EXPECT_EQ(ours, Dequantized(t, false));
}

TEST(Fp8Quantize, SaturatesAndKeepsZeros) {
  // One tile: amax 896 -> scale 2; 896 is 448 * 2 exactly, zeros stay zero,
  // an all-zero tile gets the amax floor (finite scale, no NaN).
  std::vector<float> x(256, 0.0f);
  x[0] = 896.0f;
  x[1] = -3.0f;  // 1.5 in e4m3 units: exact
  x[2] = 1.1f;   // 0.55 -> 0.5625 (nearest e4m3), times 2
  std::vector<float> out(x.size());
  Fp8RoundTrip(x.data(), 1, 256, 256, Fp8Grouping::kRowTiles, out.data());
  EXPECT_EQ(out[0], 896.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(out[2], 1.125f);
  for (int i = 3; i < 256; ++i) ASSERT_EQ(out[i], 0.0f);
}

struct GemmCase {
  const char* name;
  Transpose ta, tb;
  int m, n, k;
};

// Runs one linear-scope GEMM and the reference, and compares.
void CheckLinearGemm(const GemmCase& g, uint32_t seed) {
  SCOPED_TRACE(g.name);
  const bool a_t = g.ta == Transpose::kYes, b_t = g.tb == Transpose::kYes;
  // Stored shapes, with padded leading dimensions to test strides.
  const int a_rows = a_t ? g.k : g.m, a_cols = a_t ? g.m : g.k, lda = a_cols + 3;
  const int b_rows = b_t ? g.n : g.k, b_cols = b_t ? g.k : g.n, ldb = b_cols + 5;
  std::vector<float> a = Random(static_cast<int64_t>(a_rows) * lda, seed);
  std::vector<float> b = Random(static_cast<int64_t>(b_rows) * ldb, seed + 1, 0.05f);
  const int ldc = g.n + 2;
  std::vector<float> c0 = Random(static_cast<int64_t>(g.m) * ldc, seed + 2);
  const float alpha = 0.75f, beta = 1.0f;

  Fp8EmulationOps ops(MakeCpuOps(2));
  std::vector<float> c = c0;
  {
    GemmScopeGuard linear(ops, GemmScope::kLinear);
    ops.Gemm(g.ta, g.tb, g.m, g.n, g.k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  }
  EXPECT_EQ(ops.quantized_gemms(), 1);
  EXPECT_EQ(ops.gemm_scope(), GemmScope::kDefault);

  // The reference wants K-major [rows, K] operands: op(A) and op(B)^T.
  std::vector<float> op_a(static_cast<size_t>(g.m) * g.k), op_bt(static_cast<size_t>(g.n) * g.k);
  for (int i = 0; i < g.m; ++i)
    for (int p = 0; p < g.k; ++p) op_a[i * g.k + p] = a_t ? a[p * lda + i] : a[i * lda + p];
  for (int j = 0; j < g.n; ++j)
    for (int p = 0; p < g.k; ++p) op_bt[j * g.k + p] = b_t ? b[j * ldb + p] : b[p * ldb + j];
  const ref::Fp8Tensor qa = ref::QuantizeActivation(op_a.data(), g.m, g.k, false);
  ref::Fp8Tensor qb;
  ref::Fp8BScales mode;
  if (!a_t) {
    // Forward / dgrad: B is the weight, blocked as STORED ([n, k] forward,
    // [k, n] dgrad), which the reference's transposed weight quantizer does.
    std::vector<float> stored(static_cast<size_t>(b_rows) * b_cols);
    for (int r = 0; r < b_rows; ++r)
      for (int s = 0; s < b_cols; ++s) stored[r * b_cols + s] = b[r * ldb + s];
    qb = ref::QuantizeWeight(stored.data(), b_rows, b_cols, /*transpose=*/!b_t);
    mode = ref::Fp8BScales::kBlock128x128;
  } else {
    qb = ref::QuantizeActivation(op_bt.data(), g.n, g.k, false);
    mode = ref::Fp8BScales::kTile1x128;
  }
  const std::vector<float> d = ref::Fp8GemmFloat(qa, qb, mode);
  const std::vector<float> va = Dequantized(qa, true);
  const std::vector<float> vb = Dequantized(qb, mode == ref::Fp8BScales::kTile1x128);

  double fp8_vs_fp32 = 0, fp32_norm = 0;
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      double abs_sum = 0, exact = 0;
      for (int p = 0; p < g.k; ++p) {
        abs_sum += std::fabs(static_cast<double>(va[i * g.k + p]) * vb[j * g.k + p]);
        exact += static_cast<double>(op_a[i * g.k + p]) * op_bt[j * g.k + p];
      }
      const double expect = alpha * d[i * g.n + j] + beta * c0[i * ldc + j];
      // fp32 summation over k of products bounded by abs_sum, plus the
      // rounding of the output.
      const double tol = 4e-7 * (g.k + 8) * alpha * abs_sum + 1e-6 * std::fabs(expect);
      ASSERT_NEAR(c[i * ldc + j], expect, tol) << "at " << i << "," << j;
      fp8_vs_fp32 += std::pow(alpha * (d[i * g.n + j] - exact), 2);
      fp32_norm += std::pow(alpha * exact, 2);
    }
  // The quantization really happened, and its error is e4m3-sized (3
  // mantissa bits: a few percent of the product, relative in norm).
  const double rel = std::sqrt(fp8_vs_fp32 / fp32_norm);
  EXPECT_GT(rel, 1e-3);
  EXPECT_LT(rel, 0.08);
}

TEST(Fp8EmulationGemm, ForwardMatchesReference) {
  CheckLinearGemm({"forward x W^T", Transpose::kNo, Transpose::kYes, 70, 260, 300}, 10);
}

TEST(Fp8EmulationGemm, DgradMatchesReference) {
  CheckLinearGemm({"dgrad dy W", Transpose::kNo, Transpose::kNo, 70, 300, 260}, 20);
}

TEST(Fp8EmulationGemm, WgradMatchesReference) {
  CheckLinearGemm({"wgrad dy^T x", Transpose::kYes, Transpose::kNo, 260, 150, 200}, 30);
}

TEST(Fp8EmulationGemm, WgradWithTransposedBMatchesReference) {
  CheckLinearGemm({"A^T B^T", Transpose::kYes, Transpose::kYes, 40, 50, 140}, 40);
}

TEST(Fp8EmulationGemm, DefaultScopeIsPlainFp32) {
  const int m = 33, n = 65, k = 129;
  std::vector<float> a = Random(m * k, 5), b = Random(n * k, 6);
  std::vector<float> c1(m * n, 0.0f), c2(m * n, 0.0f);
  Fp8EmulationOps fp8(MakeCpuOps(2));
  CpuOps fp32(2);
  fp8.Gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
           c1.data(), n);
  fp32.Gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
            c2.data(), n);
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(fp8.quantized_gemms(), 0);
}

// The shipped recipe (MakeFp8EmulationOps) runs what is outside the linear
// scope through the bf16 emulation, as CudaOps' kFp8 runs it in bf16.
TEST(Fp8EmulationGemm, OutsideTheScopeTheRecipeIsBf16) {
  const int m = 33, n = 65, k = 129;
  std::vector<float> a = Random(m * k, 7), b = Random(n * k, 8);
  std::vector<float> c1(m * n, 0.0f), c2(m * n, 0.0f), c3(m * n, 0.0f);
  std::unique_ptr<Ops> fp8 = MakeFp8EmulationOps(2);
  std::unique_ptr<Ops> bf16 = MakeBf16EmulationOps(2);
  CpuOps fp32(2);
  fp8->Gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
            c1.data(), n);
  bf16->Gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
             c2.data(), n);
  fp32.Gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
            c3.data(), n);
  EXPECT_EQ(c1, c2);
  EXPECT_NE(c1, c3);
  EXPECT_EQ(static_cast<Fp8EmulationOps*>(fp8.get())->quantized_gemms(), 0);
}

TEST(Fp8EmulationGemm, ScopeGuardsNestAndRestore) {
  Fp8EmulationOps ops(MakeCpuOps(1));
  {
    GemmScopeGuard outer(ops, GemmScope::kLinear);
    {
      GemmScopeGuard inner(ops, GemmScope::kDefault);
      EXPECT_EQ(ops.gemm_scope(), GemmScope::kDefault);
    }
    EXPECT_EQ(ops.gemm_scope(), GemmScope::kLinear);
  }
  EXPECT_EQ(ops.gemm_scope(), GemmScope::kDefault);
  // The fp32 backend keeps no scope.
  CpuOps cpu(1);
  EXPECT_EQ(cpu.SetGemmScope(GemmScope::kLinear), GemmScope::kDefault);
}

}  // namespace
}  // namespace loom::kernels::cpu
