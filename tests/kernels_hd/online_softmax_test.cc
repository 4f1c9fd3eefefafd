// The online-softmax update, fed block by block, must give the same log-sum-exp
// and normalized weights as a two-pass softmax in double, including rows whose
// first blocks (or all blocks) are fully masked.
#include "kernels/cuda/hd/online_softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace loom::kernels::cuda {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Streamed {
  float lse;
  std::vector<double> weights;  // normalized softmax weights
};

// Mirrors the kernel: per block take the max, rescale the running sum and the
// per-element accumulator, add exp2(x - ref).
Streamed StreamSoftmax(const std::vector<float>& scores_log2, int block) {
  float running_max = kNegInf, running_sum = 0;
  std::vector<double> acc(scores_log2.size(), 0.0);  // one-hot "values": acc = P unnormalized
  for (size_t b0 = 0; b0 < scores_log2.size(); b0 += block) {
    size_t b1 = std::min(scores_log2.size(), b0 + block);
    float block_max = kNegInf;
    for (size_t i = b0; i < b1; ++i) block_max = std::max(block_max, scores_log2[i]);
    float rescale = OnlineSoftmaxRescale(&running_max, block_max);
    EXPECT_FALSE(std::isnan(rescale));
    running_sum *= rescale;
    for (double& a : acc) a *= rescale;
    float ref = SoftmaxReference(running_max);
    for (size_t i = b0; i < b1; ++i) {
      float p = std::exp2(scores_log2[i] - ref);
      running_sum += p;
      acc[i] += p;
    }
  }
  Streamed out;
  out.lse = SoftmaxLse(running_max, running_sum);
  float inv = SoftmaxInvSum(running_sum);
  for (double a : acc) out.weights.push_back(a * inv);
  return out;
}

TEST(OnlineSoftmax, MatchesTwoPassSoftmax) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (int trial = 0; trial < 50; ++trial) {
    int n = 1 + trial * 7;
    std::vector<float> s(n);
    for (float& x : s) x = nd(rng);
    // A few masked entries, including a fully masked leading block.
    for (int i = 0; i < std::min(n - 1, 9); ++i) s[i] = kNegInf;
    double mx = -INFINITY, sum = 0;
    for (float x : s) mx = std::max(mx, static_cast<double>(x));
    for (float x : s) sum += std::exp2(x - mx);
    double lse_natural = (mx + std::log2(sum)) * std::log(2.0);
    for (int block : {1, 4, 8, 64}) {
      Streamed r = StreamSoftmax(s, block);
      EXPECT_NEAR(r.lse, lse_natural, 1e-5 * std::max(1.0, std::fabs(lse_natural)));
      for (int i = 0; i < n; ++i)
        EXPECT_NEAR(r.weights[i], std::exp2(s[i] - mx) / sum, 1e-6) << i;
    }
  }
}

TEST(OnlineSoftmax, FullyMaskedRowGivesZerosAndInfiniteLse) {
  std::vector<float> s(20, kNegInf);
  Streamed r = StreamSoftmax(s, 8);
  EXPECT_EQ(r.lse, std::numeric_limits<float>::infinity());
  for (double w : r.weights) EXPECT_EQ(w, 0.0);
}

TEST(OnlineSoftmax, RescaleOfEmptyRowIsZeroNotNan) {
  float m = kNegInf;
  EXPECT_EQ(OnlineSoftmaxRescale(&m, kNegInf), 0.0f);
  EXPECT_EQ(m, kNegInf);
  EXPECT_EQ(OnlineSoftmaxRescale(&m, 3.0f), 0.0f);  // nothing accumulated yet
  EXPECT_EQ(m, 3.0f);
  EXPECT_EQ(OnlineSoftmaxRescale(&m, 1.0f), 1.0f);  // max unchanged
  EXPECT_FLOAT_EQ(OnlineSoftmaxRescale(&m, 5.0f), 0.25f);
}

}  // namespace
}  // namespace loom::kernels::cuda
