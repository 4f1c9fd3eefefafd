// FP8 e4m3 conversion and DeepSeek-V3 block scales, checked against the format
// itself: every code decodes to the value the spec gives, and every float
// rounds to the nearest code (ties to even), saturating at +-448.
#include "kernels/cuda/hd/fp8_e4m3.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace loom::kernels::cuda {
namespace {

// Independent decoder: value = (-1)^s * 2^(e-7) * (1 + m/8), subnormal e == 0.
double SpecValue(int code) {
  int s = (code >> 7) & 1, e = (code >> 3) & 15, m = code & 7;
  double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

bool IsNanCode(int code) { return (code & 0x7f) == 0x7f; }

TEST(E4m3, DecodesEveryCodeAsTheSpecSays) {
  for (int c = 0; c < 256; ++c) {
    float v = E4m3ToFloat(static_cast<uint8_t>(c));
    if (IsNanCode(c)) {
      EXPECT_TRUE(std::isnan(v)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(v), SpecValue(c)) << c;
    }
  }
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
}

TEST(E4m3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if (IsNanCode(c)) continue;
    if (c == 0x80) continue;  // -0 encodes back to -0 == 0x80 too; checked below
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(c))), c) << c;
  }
  EXPECT_EQ(FloatToE4m3(-0.0f), 0x80);
}

// Brute force nearest code with ties to the even mantissa (the even code).
int NearestCode(float x) {
  double ax = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x7f; ++c) {
    double err = std::fabs(SpecValue(c) - ax);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  if (ax > 448.0) best = 0x7e;  // saturate
  return (std::signbit(x) ? 0x80 : 0) | best;
}

TEST(E4m3, RoundsToNearestEvenOnRandomAndBoundaryValues) {
  std::mt19937 rng(7);
  std::vector<float> xs;
  for (int c = 0; c < 0x7e; ++c) {  // midpoints and their neighbours
    double mid = (SpecValue(c) + SpecValue(c + 1)) / 2;
    float fm = static_cast<float>(mid);
    xs.push_back(fm);
    xs.push_back(std::nextafter(fm, 0.0f));
    xs.push_back(std::nextafter(fm, 1000.0f));
  }
  std::uniform_real_distribution<float> exp_dist(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::exp2(exp_dist(rng)));
  for (float x : xs) {
    EXPECT_EQ(FloatToE4m3(x), NearestCode(x)) << x;
    EXPECT_EQ(FloatToE4m3(-x), NearestCode(-x)) << -x;
  }
}

TEST(E4m3, SaturatesInsteadOfOverflowing) {
  for (float x : {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, 3.4e38f,
                  std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(FloatToE4m3(x), 0x7e) << x;
    EXPECT_EQ(FloatToE4m3(-x), 0xfe) << x;
  }
  EXPECT_TRUE(IsNanCode(FloatToE4m3(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Fp8Scale, IsAmaxOver448AndMapsAmaxToTheTopCode) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exp_dist(-30.0f, 30.0f);
  for (int i = 0; i < 5000; ++i) {
    float amax = std::exp2(exp_dist(rng));
    Fp8Scale s = ComputeFp8Scale(amax);
    EXPECT_EQ(s.scale, amax / 448.0f);
    EXPECT_EQ(s.inv_scale, 448.0f / amax);
    EXPECT_EQ(QuantizeE4m3(amax, s.inv_scale), 0x7e) << amax;
    EXPECT_EQ(QuantizeE4m3(-amax, s.inv_scale), 0xfe) << amax;
    // The dequantized maximum is within one rounding of amax.
    EXPECT_NEAR(E4m3ToFloat(0x7e) * s.scale, amax, amax * 1e-6f);
  }
}

TEST(Fp8Scale, ZeroBlockGetsFiniteScaleAndZeroCodes) {
  Fp8Scale s = ComputeFp8Scale(0.0f);
  EXPECT_TRUE(std::isfinite(s.scale));
  EXPECT_TRUE(std::isfinite(s.inv_scale));
  EXPECT_GT(s.scale, 0.0f);
  EXPECT_EQ(QuantizeE4m3(0.0f, s.inv_scale), 0);
  Fp8Scale n = ComputeFp8Scale(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isfinite(n.inv_scale));
}

TEST(Fp8Scale, QuantizationErrorIsWithinHalfAStep) {
  // Relative step of e4m3 normals is 2^-3; half of that bounds the error of
  // values in the normal range of the scaled block.
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.5f);
  std::vector<float> block(128);
  float amax = 0;
  for (float& x : block) {
    x = nd(rng);
    amax = std::max(amax, std::fabs(x));
  }
  Fp8Scale s = ComputeFp8Scale(amax);
  for (float x : block) {
    float back = E4m3ToFloat(QuantizeE4m3(x, s.inv_scale)) * s.scale;
    float tol = std::max(std::fabs(x) * 0.0625f, s.scale * std::ldexp(1.0f, -10));
    EXPECT_NEAR(back, x, tol * 1.0001f) << x;
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
