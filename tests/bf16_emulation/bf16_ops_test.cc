// The bf16 emulation's pieces: the shared rounding function
// (kernels/cuda/hd/bf16_bits.h) against an independent reference on every
// bf16 pattern with the low halves that decide rounding (ties, NaN, Inf,
// subnormals, overflow), and Bf16EmulationOps' GEMM and attention against the
// fp32 backend run on inputs rounded beforehand: equal bit for bit, since the
// emulation must round exactly those values and nothing else.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/bf16_emulation_ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/hd/bf16_bits.h"

namespace loom::kernels::cpu {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Independent of the bias trick under test: the two bf16 neighbours of a
// finite f (truncation toward zero, and one bf16 step further from zero, which
// past the largest finite bf16 is 2^128, i.e. infinity), chosen by exact
// distance in double; a tie goes to the neighbour whose last kept mantissa
// bit is 0.
uint16_t ReferenceBf16Bits(float f) {
  const uint32_t u = ToBits(f);
  if (std::isinf(f)) return static_cast<uint16_t>(u >> 16);
  const uint32_t lo = u & 0xffff0000u;
  const uint32_t hi = lo + 0x10000u;
  const double v_lo = FromBits(lo);
  const double v_hi = (hi & 0x7f800000u) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), f)
                                                         : static_cast<double>(FromBits(hi));
  const double d_lo = std::fabs(static_cast<double>(f) - v_lo);
  const double d_hi = std::fabs(v_hi - static_cast<double>(f));
  if (d_lo < d_hi) return static_cast<uint16_t>(lo >> 16);
  if (d_hi < d_lo) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

TEST(Bf16Rounding, MatchesReferenceOnEveryPatternAndRoundingCase) {
  // Every bf16 pattern (sign, exponent, 7 mantissa bits) with the low halves
  // below, at and above the halfway point, so that every binade, both signs,
  // the subnormals and the edge of overflow are covered.
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x3fffu, 0x7fffu, 0x8000u, 0x8001u, 0xc000u, 0xffffu};
  int64_t checked = 0;
  for (uint32_t high = 0; high <= 0xffffu; ++high) {
    for (uint32_t low : lows) {
      const uint32_t u = (high << 16) | low;
      const float f = FromBits(u);
      if (std::isnan(f)) continue;  // below
      ASSERT_EQ(cuda::FloatToBf16Bits(f), ReferenceBf16Bits(f)) << std::hex << "input 0x" << u;
      ++checked;
    }
  }
  EXPECT_GT(checked, 500000);
}

TEST(Bf16Rounding, TiesGoToEvenAndOverflowGoesToInfinity) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1.
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0x3f808000u)), 0x3f80u);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0x3f818000u)), 0x3f82u);
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0xbf818000u)), 0xbf82u);
  // The largest finite float is beyond half a step above bf16's largest.
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0x7f7fffffu)), 0x7f80u);
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0xff7fffffu)), 0xff80u);
  // Just below the halfway point stays finite.
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0x7f7f7fffu)), 0x7f7fu);
  EXPECT_EQ(cuda::FloatToBf16Bits(INFINITY), 0x7f80u);
  EXPECT_EQ(cuda::FloatToBf16Bits(-INFINITY), 0xff80u);
  EXPECT_EQ(cuda::FloatToBf16Bits(-0.0f), 0x8000u);
}

TEST(Bf16Rounding, SubnormalsRoundLikeNormals) {
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0x00000001u)), 0x0000u);  // tiny: to zero
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0x00008000u)), 0x0000u);  // tie: even 0
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0x00018000u)), 0x0002u);  // tie: even 2
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0x007fffffu)), 0x0080u);  // up to the smallest normal
  EXPECT_EQ(cuda::FloatToBf16Bits(FromBits(0x80008001u)), 0x8001u);
}

TEST(Bf16Rounding, NanStaysQuietNanWithItsSign) {
  // Signalling NaNs with payloads only in the low half would become Inf if
  // truncated or rounded naively.
  for (uint32_t u : {0x7f800001u, 0x7fc00000u, 0x7f80ffffu, 0xff800001u, 0xffffffffu}) {
    const uint16_t b = cuda::FloatToBf16Bits(FromBits(u));
    EXPECT_TRUE(std::isnan(cuda::Bf16BitsToFloat(b))) << std::hex << u;
    EXPECT_EQ(b & 0x0040u, 0x0040u) << "not quiet: " << std::hex << u;
    EXPECT_EQ(b & 0x8000u, (u >> 16) & 0x8000u) << "sign lost: " << std::hex << u;
  }
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// rows x cols of x (leading dimension ld), rounded, dense.
std::vector<float> RoundedDense(const std::vector<float>& x, int64_t rows, int64_t cols,
                                int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = cuda::RoundToBf16(x[r * ld + c]);
  return out;
}

TEST(Bf16EmulationGemm, EqualsFp32GemmOnRoundedInputsForAllTransposesAndScopes) {
  const int64_t m = 37, n = 53, k = 70;
  CpuOps fp32(2);
  Bf16EmulationOps bf16(MakeCpuOps(2));
  int64_t gemms = 0;
  for (GemmScope scope : {GemmScope::kDefault, GemmScope::kLinear}) {
    GemmScopeGuard guard(bf16, scope);
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        const bool a_t = ta == Transpose::kYes, b_t = tb == Transpose::kYes;
        const int64_t a_rows = a_t ? k : m, a_cols = a_t ? m : k, lda = a_cols + 3;
        const int64_t b_rows = b_t ? n : k, b_cols = b_t ? k : n, ldb = b_cols + 5;
        const int64_t ldc = n + 2;
        const std::vector<float> a = Random(a_rows * lda, 1 + gemms);
        const std::vector<float> b = Random(b_rows * ldb, 100 + gemms);
        const std::vector<float> c0 = Random(m * ldc, 200 + gemms);
        std::vector<float> got = c0, want = c0, unrounded = c0;
        bf16.Gemm(ta, tb, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, 0.5f, got.data(), ldc);
        const std::vector<float> ra = RoundedDense(a, a_rows, a_cols, lda);
        const std::vector<float> rb = RoundedDense(b, b_rows, b_cols, ldb);
        fp32.Gemm(ta, tb, m, n, k, 0.75f, ra.data(), a_cols, rb.data(), b_cols, 0.5f,
                  want.data(), ldc);
        ASSERT_EQ(got, want) << "ta " << a_t << " tb " << b_t;
        // The rounding happened: plain fp32 on the raw inputs differs.
        fp32.Gemm(ta, tb, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, 0.5f, unrounded.data(),
                  ldc);
        EXPECT_NE(got, unrounded);
        ++gemms;
      }
    }
  }
  EXPECT_EQ(bf16.rounded_gemms(), gemms);
  EXPECT_EQ(bf16.SetGemmScope(GemmScope::kDefault), GemmScope::kDefault);  // guards restored
}

TEST(Bf16EmulationGemm, Bf16InputsAreUnchanged) {
  // Values bf16 already represents pass through: the result is the fp32 one.
  const int64_t m = 9, n = 11, k = 300;
  std::vector<float> a = Random(m * k, 7), b = Random(k * n, 8);
  for (float& x : a) x = cuda::RoundToBf16(x);
  for (float& x : b) x = cuda::RoundToBf16(x);
  std::vector<float> got(m * n, 1.0f), want(m * n, 1.0f);
  Bf16EmulationOps bf16(MakeCpuOps(1));
  CpuOps fp32(1);
  bf16.Gemm(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
            got.data(), n);
  fp32.Gemm(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
            want.data(), n);
  EXPECT_EQ(got, want);
}

TEST(Bf16EmulationAttention, RoundsWhatTheCudaBackendRounds) {
  // Fused QKV (q, k, v are column slices with one token stride), GQA.
  AttentionDims dims;
  dims.batch = 2;
  dims.seq_q = dims.seq_kv = 24;
  dims.num_heads = 4;
  dims.num_kv_heads = 2;
  dims.head_dim = 16;
  dims.scale = 0.25f;
  const int64_t qkv_stride = (dims.num_heads + 2 * dims.num_kv_heads) * dims.head_dim;
  dims.q_row_stride = dims.k_row_stride = dims.v_row_stride = qkv_stride;
  dims.o_row_stride = dims.num_heads * dims.head_dim + 4;  // strided output too
  const int64_t tokens = dims.batch * dims.seq_q;
  const int64_t q_cols = dims.num_heads * dims.head_dim;
  const int64_t kv_cols = dims.num_kv_heads * dims.head_dim;
  const int64_t k_col = q_cols, v_col = q_cols + kv_cols;
  const std::vector<float> qkv = Random(tokens * qkv_stride, 21);
  const std::vector<float> d_out = Random(tokens * dims.o_row_stride, 22);
  const int64_t lse_n = dims.batch * dims.num_heads * dims.seq_q;

  Bf16EmulationOps bf16(MakeCpuOps(2));
  std::vector<float> out(tokens * dims.o_row_stride, 0.0f), lse(lse_n);
  bf16.AttentionForward(dims, qkv.data(), qkv.data() + k_col, qkv.data() + v_col, out.data(),
                        lse.data());
  std::vector<float> dqkv(qkv.size(), 0.0f);
  bf16.AttentionBackward(dims, qkv.data(), qkv.data() + k_col, qkv.data() + v_col, out.data(),
                         lse.data(), d_out.data(), dqkv.data(), dqkv.data() + k_col,
                         dqkv.data() + v_col);
  EXPECT_EQ(bf16.rounded_attention_calls(), 2);

  // Expected: fp32 attention on packed rounded inputs, outputs rounded.
  CpuOps fp32(2);
  AttentionDims packed = dims;
  packed.q_row_stride = packed.o_row_stride = q_cols;
  packed.k_row_stride = packed.v_row_stride = kv_cols;
  const std::vector<float> rq = RoundedDense(qkv, tokens, q_cols, qkv_stride);
  const std::vector<float> rk = RoundedDense(
      std::vector<float>(qkv.begin() + k_col, qkv.end()), tokens, kv_cols, qkv_stride);
  const std::vector<float> rv = RoundedDense(
      std::vector<float>(qkv.begin() + v_col, qkv.end()), tokens, kv_cols, qkv_stride);
  std::vector<float> want_out(tokens * q_cols), want_lse(lse_n);
  fp32.AttentionForward(packed, rq.data(), rk.data(), rv.data(), want_out.data(), want_lse.data());
  EXPECT_EQ(lse, want_lse);  // lse stays fp32
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < q_cols; ++c)
      ASSERT_EQ(out[t * dims.o_row_stride + c], cuda::RoundToBf16(want_out[t * q_cols + c]))
          << "out " << t << "," << c;

  const std::vector<float> ro = RoundedDense(out, tokens, q_cols, dims.o_row_stride);
  const std::vector<float> rdo = RoundedDense(d_out, tokens, q_cols, dims.o_row_stride);
  std::vector<float> dq(tokens * q_cols), dk(tokens * kv_cols), dv(tokens * kv_cols);
  fp32.AttentionBackward(packed, rq.data(), rk.data(), rv.data(), ro.data(), lse.data(),
                         rdo.data(), dq.data(), dk.data(), dv.data());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < q_cols; ++c)
      ASSERT_EQ(dqkv[t * qkv_stride + c], cuda::RoundToBf16(dq[t * q_cols + c])) << "dq";
    for (int64_t c = 0; c < kv_cols; ++c) {
      ASSERT_EQ(dqkv[t * qkv_stride + k_col + c], cuda::RoundToBf16(dk[t * kv_cols + c])) << "dk";
      ASSERT_EQ(dqkv[t * qkv_stride + v_col + c], cuda::RoundToBf16(dv[t * kv_cols + c])) << "dv";
    }
  }
}

TEST(Bf16EmulationOps, OtherOpsAreTheFp32Backend) {
  const int64_t rows = 5, dim = 64;
  const std::vector<float> x = Random(rows * dim, 31), w = Random(dim, 32);
  std::vector<float> y1(rows * dim), y2(rows * dim), r1(rows), r2(rows);
  Bf16EmulationOps bf16(MakeCpuOps(1));
  CpuOps fp32(1);
  bf16.RmsNormForward(x.data(), w.data(), rows, dim, 1e-5f, y1.data(), r1.data());
  fp32.RmsNormForward(x.data(), w.data(), rows, dim, 1e-5f, y2.data(), r2.data());
  EXPECT_EQ(y1, y2);
  EXPECT_EQ(r1, r2);
  EXPECT_STREQ(bf16.name(), "cpu-bf16-emulation");
  EXPECT_EQ(MakeBf16EmulationOps(1)->device(), DeviceType::kCpu);
}

}  // namespace
}  // namespace loom::kernels::cpu
