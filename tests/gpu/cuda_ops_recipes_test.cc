// CudaOps' precision recipes (CudaOpsOptions::recipe) against their CPU
// emulations, GEMM by GEMM. Part of the cuda_ops_test binary. The fp8 GEMM
// plan (fp8_gemm_plan.h: operand roles, quantizers, transposes, padding) is
// executed here with the FP8 reference quantizers and GEMM and must agree
// with the CPU emulation, so its logic is checked without a GPU; the device
// tests skip with the reason where there is no CUDA device.
//
// Tolerances (inputs uniform in [-1, 1], weights scaled by 0.05):
//  - kBf16 Gemm vs CpuOps on inputs rounded with RoundToBf16 (the rounding
//    the CPU emulation shares, kernels/cuda/hd/bf16_bits.h): the same
//    products summed in another order, |diff| <= 2e-6 * k + 1e-6 * |ref|,
//    as the fp32 GEMM test; bf16 rounding error itself is ~100x larger;
//  - kFp8 linear-scope Gemm vs Fp8EmulationOps: same quantized operands, the
//    GPU applies the scales per 128-long partial sum and sums in another
//    order: |diff| <= 4e-7 * (k + 8) * alpha * sum |a| |b| * 1.2 + 1e-6 |ref|
//    (tests/fp8_emulation's bound; 1.2 covers e4m3's rounding of |a| |b|);
//  - kFp8 outside the linear scope: as kBf16.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fp8_emulation_ops.h"
#include "kernels/cuda/backend/cuda_ops.h"
#include "kernels/cuda/backend/fp8_gemm_plan.h"
#include "kernels/cuda/hd/bf16_bits.h"
#include "kernels/cuda/reference/fp8_reference.h"

namespace loom::kernels::cuda {
namespace {

std::vector<float> Uniform(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

class CudaRecipeTest : public ::testing::Test {
 protected:
  // Skips (no device) or fails leaving gpu_ null; the caller then returns.
  void Start(CudaRecipe recipe) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      GTEST_SKIP() << "no CUDA device";
    CudaOpsOptions options;
    options.recipe = recipe;
    options.abort_on_error = false;
    std::string why;
    gpu_ = CudaOps::Create(options, &why);
    ASSERT_NE(gpu_, nullptr) << why;
  }
  void TearDown() override {
    if (gpu_) {
      EXPECT_TRUE(gpu_->ok()) << gpu_->error();
    }
  }

  // C = alpha op(A) op(B) + beta C on the device, for host inputs.
  std::vector<float> DeviceGemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k,
                                float alpha, const std::vector<float>& a, int64_t lda,
                                const std::vector<float>& b, int64_t ldb, float beta,
                                const std::vector<float>& c, int64_t ldc) {
    Buffer da = Up(a), db = Up(b), dc = Up(c);
    gpu_->Gemm(ta, tb, m, n, k, alpha, da.f32(), lda, db.f32(), ldb, beta, dc.f32(), ldc);
    std::vector<float> out(c.size());
    gpu_->CopyDeviceToHost(out.data(), dc.data(), static_cast<int64_t>(out.size() * 4));
    return out;
  }
  Buffer Up(const std::vector<float>& host) {
    Buffer b = gpu_->AllocateFloats(static_cast<int64_t>(host.size()));
    gpu_->CopyHostToDevice(b.data(), host.data(), b.bytes());
    return b;
  }

  std::unique_ptr<CudaOps> gpu_;
};

struct Shape {
  const char* name;
  Transpose ta, tb;
  int64_t m, n, k;
};

struct Operands {
  std::vector<float> a, b, c;
  int64_t lda, ldb, ldc, a_rows, a_cols, b_rows, b_cols;
};

// Stored operands with padded leading dimensions (strides exercised).
Operands MakeOperands(const Shape& s, uint32_t seed, float b_scale) {
  Operands o;
  const bool a_t = s.ta == Transpose::kYes, b_t = s.tb == Transpose::kYes;
  o.a_rows = a_t ? s.k : s.m;
  o.a_cols = a_t ? s.m : s.k;
  o.b_rows = b_t ? s.n : s.k;
  o.b_cols = b_t ? s.k : s.n;
  o.lda = o.a_cols + 3;
  o.ldb = o.b_cols + 5;
  o.ldc = s.n + 2;
  o.a = Uniform(o.a_rows * o.lda, seed);
  o.b = Uniform(o.b_rows * o.ldb, seed + 1, b_scale);
  o.c = Uniform(s.m * o.ldc, seed + 2);
  return o;
}

std::vector<float> Rounded(std::vector<float> x) {
  for (float& v : x) v = RoundToBf16(v);
  return x;
}

void ExpectBf16Gemm(const Shape& s, const Operands& o, float alpha, float beta,
                    const std::vector<float>& got) {
  cpu::CpuOps cpu(2);
  std::vector<float> want = o.c;
  const std::vector<float> ra = Rounded(o.a), rb = Rounded(o.b);
  cpu.Gemm(s.ta, s.tb, s.m, s.n, s.k, alpha, ra.data(), o.lda, rb.data(), o.ldb, beta,
           want.data(), o.ldc);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      const float w = want[i * o.ldc + j];
      ASSERT_NEAR(got[i * o.ldc + j], w, 2e-6 * s.k + 1e-6 * std::fabs(w))
          << s.name << " at " << i << "," << j;
    }
}

TEST_F(CudaRecipeTest, Bf16GemmEqualsCpuOnRoundedInputs) {
  Start(CudaRecipe::kBf16);
  if (gpu_ == nullptr) return;  // skipped (no device) or failed to start
  const Shape shapes[] = {{"NN", Transpose::kNo, Transpose::kNo, 67, 45, 96},
                          {"NT", Transpose::kNo, Transpose::kYes, 67, 45, 96},
                          {"TN", Transpose::kYes, Transpose::kNo, 67, 45, 96},
                          {"TT", Transpose::kYes, Transpose::kYes, 67, 45, 96}};
  uint32_t seed = 100;
  for (const Shape& s : shapes) {
    const Operands o = MakeOperands(s, seed += 10, 1.0f);
    const std::vector<float> got =
        DeviceGemm(s.ta, s.tb, s.m, s.n, s.k, 0.5f, o.a, o.lda, o.b, o.ldb, 1.0f, o.c, o.ldc);
    ExpectBf16Gemm(s, o, 0.5f, 1.0f, got);
  }
  EXPECT_EQ(gpu_->gemm_counts().bf16, 4);
  EXPECT_EQ(gpu_->gemm_counts().fp32, 0);
}

void ExpectFp8Gemm(const Shape& s, const Operands& o, float alpha, float beta,
                   const std::vector<float>& got) {
  cpu::Fp8EmulationOps emulation(cpu::MakeCpuOps(2));
  std::vector<float> want = o.c;
  {
    GemmScopeGuard linear(emulation, GemmScope::kLinear);
    emulation.Gemm(s.ta, s.tb, s.m, s.n, s.k, alpha, o.a.data(), o.lda, o.b.data(), o.ldb, beta,
                   want.data(), o.ldc);
  }
  ASSERT_EQ(emulation.quantized_gemms(), 1);
  const bool a_t = s.ta == Transpose::kYes, b_t = s.tb == Transpose::kYes;
  double max_diff_over_tol = 0;
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double abs_sum = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const float av = a_t ? o.a[p * o.lda + i] : o.a[i * o.lda + p];
        const float bv = b_t ? o.b[j * o.ldb + p] : o.b[p * o.ldb + j];
        abs_sum += std::fabs(static_cast<double>(av) * bv);
      }
      const double w = want[i * o.ldc + j];
      const double tol = 4e-7 * (s.k + 8) * alpha * abs_sum * 1.2 + 1e-6 * std::fabs(w);
      const double diff = std::fabs(got[i * o.ldc + j] - w);
      max_diff_over_tol = std::max(max_diff_over_tol, diff / tol);
      ASSERT_LE(diff, tol) << s.name << " at " << i << "," << j << ": got "
                           << got[i * o.ldc + j] << " want " << w;
    }
  std::printf("%s: max |result - emulation| / tolerance %.3f\n", s.name, max_diff_over_tol);
}

// The GEMM shapes of the fp8 checks: the three linear-layer GEMMs (see
// GemmScope) with ragged sizes, A^T B^T, and an aligned shape.
const Shape kFp8Shapes[] = {
    {"forward x W^T", Transpose::kNo, Transpose::kYes, 70, 260, 300},
    {"dgrad dy W", Transpose::kNo, Transpose::kNo, 70, 300, 260},
    {"wgrad dy^T x", Transpose::kYes, Transpose::kNo, 260, 150, 200},
    {"A^T B^T", Transpose::kYes, Transpose::kYes, 40, 50, 140},
    {"aligned wgrad", Transpose::kYes, Transpose::kNo, 128, 256, 384},
};

// What cuda_gemm_fp8.cc does on the device, with the reference in place of
// the kernels: pad, quantize per the plan, block-scaled GEMM, epilogue.
std::vector<float> PlannedFp8Gemm(const Shape& s, const Operands& o, float alpha, float beta) {
  namespace ref = reference;
  const Fp8GemmPlan plan = PlanFp8Gemm(s.ta, s.tb, s.m, s.n, s.k);
  EXPECT_TRUE(plan.supported);
  auto quantize = [](const std::vector<float>& x, int64_t ld, const Fp8OperandPlan& op) {
    std::vector<float> dense(static_cast<size_t>(op.padded_rows * op.padded_cols), 0.0f);
    for (int64_t r = 0; r < op.rows; ++r)
      for (int64_t c = 0; c < op.cols; ++c) dense[r * op.padded_cols + c] = x[r * ld + c];
    const int rows = static_cast<int>(op.padded_rows), cols = static_cast<int>(op.padded_cols);
    return op.weight ? ref::QuantizeWeight(dense.data(), rows, cols, op.transpose)
                     : ref::QuantizeActivation(dense.data(), rows, cols, op.transpose);
  };
  const ref::Fp8Tensor qa = quantize(o.a, o.lda, plan.a), qb = quantize(o.b, o.ldb, plan.b);
  // The kernel's operand shapes: A [m, k], B [n, k], padded.
  EXPECT_EQ(qa.rows, plan.m);
  EXPECT_EQ(qa.cols, plan.k);
  EXPECT_EQ(qb.rows, plan.n);
  EXPECT_EQ(qb.cols, plan.k);
  const std::vector<float> d = ref::Fp8GemmFloat(
      qa, qb, plan.b_tile_scales ? ref::Fp8BScales::kTile1x128 : ref::Fp8BScales::kBlock128x128);
  std::vector<float> c = o.c;
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      float& out = c[i * o.ldc + j];
      out = alpha * d[i * plan.n + j] + (beta == 0.0f ? 0.0f : beta * out);
    }
  return c;
}

TEST(Fp8GemmPlanTest, ThePlanExecutedByTheReferenceMatchesTheCpuEmulation) {
  uint32_t seed = 600;
  for (const Shape& s : kFp8Shapes) {
    const Operands o = MakeOperands(s, seed += 10, s.ta == Transpose::kNo ? 0.05f : 1.0f);
    ExpectFp8Gemm(s, o, 0.75f, 1.0f, PlannedFp8Gemm(s, o, 0.75f, 1.0f));
  }
}

TEST(Fp8GemmPlanTest, OperandRolesPaddingAndLimits) {
  // forward: A = x [t, in] tiles; B = W [out, in] blocks as stored.
  Fp8GemmPlan p = PlanFp8Gemm(Transpose::kNo, Transpose::kYes, 70, 260, 300);
  EXPECT_TRUE(p.supported);
  EXPECT_EQ(p.m, 128);
  EXPECT_EQ(p.n, 384);
  EXPECT_EQ(p.k, 384);
  EXPECT_FALSE(p.a.weight);
  EXPECT_FALSE(p.a.transpose);
  EXPECT_TRUE(p.b.weight);
  EXPECT_FALSE(p.b.transpose);
  EXPECT_FALSE(p.b_tile_scales);
  // dgrad: B = W stored [out, in] = [k, n], blocks read transposed.
  p = PlanFp8Gemm(Transpose::kNo, Transpose::kNo, 70, 300, 260);
  EXPECT_TRUE(p.b.weight);
  EXPECT_TRUE(p.b.transpose);
  EXPECT_EQ(p.b.rows, 260);
  EXPECT_EQ(p.b.padded_cols, 384);
  // wgrad: both activations tiled along the tokens (k), 1 x 128 B scales.
  p = PlanFp8Gemm(Transpose::kYes, Transpose::kNo, 260, 150, 200);
  EXPECT_FALSE(p.a.weight);
  EXPECT_TRUE(p.a.transpose);
  EXPECT_FALSE(p.b.weight);
  EXPECT_TRUE(p.b.transpose);
  EXPECT_TRUE(p.b_tile_scales);
  // Beyond the kernels: more than 128 * 65535 rows.
  EXPECT_FALSE(PlanFp8Gemm(Transpose::kNo, Transpose::kYes, int64_t{128} * 65535 + 1, 128, 128)
                   .supported);
  EXPECT_TRUE(PlanFp8Gemm(Transpose::kNo, Transpose::kYes, int64_t{128} * 65535, 128, 128)
                  .supported);
}

TEST_F(CudaRecipeTest, Fp8LinearGemmsMatchTheCpuEmulation) {
  Start(CudaRecipe::kFp8);
  if (gpu_ == nullptr) return;  // skipped (no device) or failed to start
  uint32_t seed = 200;
  for (const Shape& s : kFp8Shapes) {
    const Operands o = MakeOperands(s, seed += 10, s.ta == Transpose::kNo ? 0.05f : 1.0f);
    GemmScopeGuard linear(*gpu_, GemmScope::kLinear);
    const std::vector<float> got =
        DeviceGemm(s.ta, s.tb, s.m, s.n, s.k, 0.75f, o.a, o.lda, o.b, o.ldb, 1.0f, o.c, o.ldc);
    ExpectFp8Gemm(s, o, 0.75f, 1.0f, got);
  }
  {
    // Aligned and dense (no padding copy): the quantizers read the caller's
    // tensors directly; beta = 0 must not read C (NaNs there must vanish).
    const Shape s{"aligned forward", Transpose::kNo, Transpose::kYes, 256, 128, 384};
    Operands o;
    o.lda = s.k;
    o.ldb = s.k;
    o.ldc = s.n;
    o.a = Uniform(s.m * s.k, 300);
    o.b = Uniform(s.n * s.k, 301, 0.05f);
    o.c = std::vector<float>(s.m * s.n, NAN);
    GemmScopeGuard linear(*gpu_, GemmScope::kLinear);
    const std::vector<float> got =
        DeviceGemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a, o.lda, o.b, o.ldb, 0.0f, o.c, o.ldc);
    o.c.assign(o.c.size(), 0.0f);  // the emulation's BLAS does not read C either
    ExpectFp8Gemm(s, o, 1.0f, 0.0f, got);
  }
  EXPECT_EQ(gpu_->gemm_counts().fp8, 6);
  EXPECT_EQ(gpu_->gemm_counts().fp8_fallback, 0);
  EXPECT_EQ(gpu_->gemm_scope(), GemmScope::kDefault);
}

TEST_F(CudaRecipeTest, Fp8OutsideTheLinearScopeIsBf16) {
  Start(CudaRecipe::kFp8);
  if (gpu_ == nullptr) return;  // skipped (no device) or failed to start
  const Shape s{"LM head", Transpose::kNo, Transpose::kYes, 67, 45, 96};
  const Operands o = MakeOperands(s, 400, 1.0f);
  const std::vector<float> got =
      DeviceGemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a, o.lda, o.b, o.ldb, 0.5f, o.c, o.ldc);
  ExpectBf16Gemm(s, o, 1.0f, 0.5f, got);
  EXPECT_EQ(gpu_->gemm_counts().bf16, 1);
  EXPECT_EQ(gpu_->gemm_counts().fp8, 0);
}

TEST_F(CudaRecipeTest, Fp32RecipeIgnoresTheScope) {
  Start(CudaRecipe::kFp32);
  if (gpu_ == nullptr) return;  // skipped (no device) or failed to start
  const Shape s{"fp32", Transpose::kNo, Transpose::kYes, 33, 40, 64};
  const Operands o = MakeOperands(s, 500, 1.0f);
  GemmScopeGuard linear(*gpu_, GemmScope::kLinear);
  const std::vector<float> got =
      DeviceGemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a, o.lda, o.b, o.ldb, 0.0f, o.c, o.ldc);
  cpu::CpuOps cpu(2);
  std::vector<float> want = o.c;
  cpu.Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0f,
           want.data(), o.ldc);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 2e-6 * s.k + 1e-6 * std::fabs(want[i])) << i;
  EXPECT_EQ(gpu_->gemm_counts().fp32, 1);
}

}  // namespace
}  // namespace loom::kernels::cuda
