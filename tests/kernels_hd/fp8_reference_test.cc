// The FP8 reference quantizers and block-scaled GEMM: layouts agree with each
// other (a transposed quantization is the quantization of the transpose), and
// the quantized GEMM approximates the float GEMM within FP8's precision.
#include "kernels/cuda/reference/fp8_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace loom::kernels::cuda::reference {
namespace {

std::vector<float> Random(int n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

std::vector<float> Transposed(const std::vector<float>& x, int rows, int cols) {
  std::vector<float> t(x.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[static_cast<size_t>(c) * rows + r] = x[static_cast<size_t>(r) * cols + c];
  return t;
}

TEST(Fp8Reference, TransposedQuantizationIsQuantizationOfTheTranspose) {
  const int rows = 200, cols = 300;  // ragged tails on both axes
  std::vector<float> x = Random(rows * cols, 1);
  std::vector<float> xt = Transposed(x, rows, cols);
  Fp8Tensor a = QuantizeActivation(x.data(), rows, cols, true);
  Fp8Tensor b = QuantizeActivation(xt.data(), cols, rows, false);
  EXPECT_EQ(a.rows, cols);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  Fp8Tensor w = QuantizeWeight(x.data(), rows, cols, true);
  Fp8Tensor wt = QuantizeWeight(xt.data(), cols, rows, false);
  EXPECT_EQ(w.codes, wt.codes);
  EXPECT_EQ(w.scales, wt.scales);
  EXPECT_EQ(w.scales.size(), 3u * 2u);
}

TEST(Fp8Reference, ScalesFollowTheBlockAmax) {
  const int rows = 4, cols = 256;
  std::vector<float> x = Random(rows * cols, 2);
  x[1 * cols + 130] = 100.0f;  // row 1, k block 1
  Fp8Tensor a = QuantizeActivation(x.data(), rows, cols, false);
  EXPECT_EQ(a.scales[1 * rows + 1], 100.0f / 448.0f);
  EXPECT_EQ(a.codes[1 * cols + 130], 0x7e);
  EXPECT_LT(a.scales[0 * rows + 1], 5.0f / 448.0f);
}

// Relative Frobenius error of the quantized GEMM against the float GEMM:
// e4m3 keeps 3 mantissa bits (relative rounding error up to 2^-4, RMS about
// 2^-4/sqrt(3) per operand), so products of random data land near 3-5e-2.
TEST(Fp8Reference, GemmApproximatesTheFloatProductForEachTrainingShape) {
  const int m = 128, n = 256, k = 384;
  std::vector<float> x = Random(m * k, 3), w = Random(n * k, 4, 0.02f), dy = Random(m * n, 5, 1e-3f);
  auto rel_err = [](const std::vector<float>& got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    return std::sqrt(num / den);
  };
  // forward: Y[m, n] = X W^T
  {
    std::vector<double> want(static_cast<size_t>(m) * n, 0.0);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j)
        for (int p = 0; p < k; ++p) want[i * n + j] += static_cast<double>(x[i * k + p]) * w[j * k + p];
    auto got = Fp8GemmFloat(QuantizeActivation(x.data(), m, k, false), QuantizeWeight(w.data(), n, k, false),
                            Fp8BScales::kBlock128x128);
    EXPECT_LT(rel_err(got, want), 0.08);
    EXPECT_GT(rel_err(got, want), 1e-4);  // it really is quantized
  }
  // data gradient: dX[m, k] = dY W = dY (W^T)^T
  {
    std::vector<double> want(static_cast<size_t>(m) * k, 0.0);
    for (int i = 0; i < m; ++i)
      for (int p = 0; p < k; ++p)
        for (int j = 0; j < n; ++j) want[i * k + p] += static_cast<double>(dy[i * n + j]) * w[j * k + p];
    auto got = Fp8GemmFloat(QuantizeActivation(dy.data(), m, n, false), QuantizeWeight(w.data(), n, k, true),
                            Fp8BScales::kBlock128x128);
    EXPECT_LT(rel_err(got, want), 0.08);
  }
  // weight gradient: dW[n, k] = dY^T X, reduction over the m tokens
  {
    std::vector<double> want(static_cast<size_t>(n) * k, 0.0);
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p)
        for (int i = 0; i < m; ++i) want[j * k + p] += static_cast<double>(dy[i * n + j]) * x[i * k + p];
    auto got = Fp8GemmFloat(QuantizeActivation(dy.data(), m, n, true), QuantizeActivation(x.data(), m, k, true),
                            Fp8BScales::kTile1x128);
    EXPECT_LT(rel_err(got, want), 0.08);
  }
}

}  // namespace
}  // namespace loom::kernels::cuda::reference
