// The CPU backend's mixture-of-experts ops (kernels/cpu/moe.cc) against the
// reference loops (kernels/reference/moe.h): bit for bit at one thread and at
// four (each output is one thread's, in the reference's order), on shapes
// with capacity drops, a selection bias and both scores. Plus the properties
// the engine relies on, checked on the reference itself: the permuted order
// is sorted by expert and stable, row_of and assignment_of are inverse, and
// unpermuting a permutation with weight 1 gives each token its kept choices'
// count times its row.
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/reference/moe.h"

namespace loom::kernels {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

template <typename T>
void ExpectBits(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(T))) << what;
}

struct Routed {
  std::vector<int32_t> expert, row_of, assignment_of;
  std::vector<float> weight, scores, probs;
  std::vector<int64_t> counts;
  std::vector<double> prob_sum;
  explicit Routed(const MoeRouteDims& d)
      : expert(d.tokens * d.top_k), row_of(expert.size()), assignment_of(expert.size(), -1),
        weight(expert.size()), scores(d.tokens * d.num_experts), probs(scores.size()),
        counts(2 * d.num_experts), prob_sum(d.num_experts) {}
};

MoeRouteDims Dims(int64_t tokens, int64_t experts, int64_t k, int64_t capacity, MoeScore score) {
  MoeRouteDims d;
  d.tokens = tokens;
  d.num_experts = experts;
  d.top_k = k;
  d.capacity = capacity;
  d.score = score;
  d.aux_loss_coef = 0.02;
  return d;
}

class MoeOpsTest : public ::testing::TestWithParam<int> {};

TEST_P(MoeOpsTest, RouteMatchesReferenceBitForBit) {
  cpu::CpuOps ops(GetParam());
  for (MoeScore score : {MoeScore::kSoftmax, MoeScore::kSigmoid}) {
    for (int64_t capacity : {int64_t{0}, int64_t{90}}) {
      const MoeRouteDims d = Dims(1031, 24, 3, capacity, score);
      const std::vector<float> logits = Random(d.tokens * d.num_experts, 5, 2.0f);
      const std::vector<float> bias = Random(d.num_experts, 6, 0.05f);
      Routed want(d), got(d);
      reference::MoeRoute(d, logits.data(), bias.data(), want.expert.data(), want.weight.data(),
                          want.scores.data(), want.probs.data(), want.row_of.data(),
                          want.assignment_of.data(), want.counts.data(), want.prob_sum.data());
      ops.MoeRoute(d, logits.data(), bias.data(), got.expert.data(), got.weight.data(),
                   got.scores.data(), got.probs.data(), got.row_of.data(), got.assignment_of.data(),
                   got.counts.data(), got.prob_sum.data());
      ExpectBits(got.expert, want.expert, "expert");
      ExpectBits(got.weight, want.weight, "weight");
      ExpectBits(got.scores, want.scores, "scores");
      ExpectBits(got.probs, want.probs, "probs");
      ExpectBits(got.row_of, want.row_of, "row_of");
      ExpectBits(got.assignment_of, want.assignment_of, "assignment_of");
      ExpectBits(got.counts, want.counts, "counts");
      ExpectBits(got.prob_sum, want.prob_sum, "prob_sum");
      if (capacity > 0) {
        int64_t kept = 0;
        for (int64_t e = 0; e < d.num_experts; ++e) kept += want.counts[e];
        EXPECT_LT(kept, d.tokens * d.top_k) << "the capacity drops some assignments";
      }
    }
  }
}

TEST_P(MoeOpsTest, PermuteUnpermuteGateGradRouterBackwardMatchReferenceBitForBit) {
  cpu::CpuOps ops(GetParam());
  const MoeRouteDims d = Dims(1031, 24, 3, 140, MoeScore::kSoftmax);
  const int64_t width = 72;
  Routed r(d);
  const std::vector<float> logits = Random(d.tokens * d.num_experts, 7, 2.0f);
  reference::MoeRoute(d, logits.data(), nullptr, r.expert.data(), r.weight.data(), r.scores.data(),
                      r.probs.data(), r.row_of.data(), r.assignment_of.data(), r.counts.data(),
                      r.prob_sum.data());
  int64_t kept = 0;
  for (int64_t e = 0; e < d.num_experts; ++e) kept += r.counts[e];
  const std::vector<float> x = Random(d.tokens * width, 8), rows = Random(kept * width, 9);
  for (const float* weight : {static_cast<const float*>(nullptr), static_cast<const float*>(r.weight.data())}) {
    std::vector<float> want(kept * width), got(kept * width);
    reference::MoePermute(kept, d.top_k, width, x.data(), r.assignment_of.data(), weight, want.data());
    ops.MoePermute(kept, d.top_k, width, x.data(), r.assignment_of.data(), weight, got.data());
    ExpectBits(got, want, "permute");
    std::vector<float> want_acc = Random(d.tokens * width, 10), got_acc = want_acc;
    reference::MoeUnpermute(d.tokens, d.top_k, width, rows.data(), r.row_of.data(), weight,
                            want_acc.data());
    ops.MoeUnpermute(d.tokens, d.top_k, width, rows.data(), r.row_of.data(), weight, got_acc.data());
    ExpectBits(got_acc, want_acc, "unpermute");
  }
  std::vector<float> want_dw(d.tokens * d.top_k), got_dw(want_dw.size());
  reference::MoeGateGrad(d.tokens, d.top_k, width, x.data(), rows.data(), r.row_of.data(),
                         want_dw.data());
  ops.MoeGateGrad(d.tokens, d.top_k, width, x.data(), rows.data(), r.row_of.data(), got_dw.data());
  ExpectBits(got_dw, want_dw, "gate grad");
  for (MoeScore score : {MoeScore::kSoftmax, MoeScore::kSigmoid}) {
    MoeRouteDims ds = d;
    ds.score = score;
    std::vector<float> want(d.tokens * d.num_experts), got(want.size());
    reference::MoeRouterBackward(ds, r.expert.data(), r.weight.data(), r.scores.data(),
                                 r.probs.data(), r.counts.data(), want_dw.data(), 0.25, want.data());
    ops.MoeRouterBackward(ds, r.expert.data(), r.weight.data(), r.scores.data(), r.probs.data(),
                          r.counts.data(), want_dw.data(), 0.25, got.data());
    ExpectBits(got, want, "router backward");
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, MoeOpsTest, ::testing::Values(1, 4));

TEST(MoeReference, PermutedOrderIsStableByExpertAndUnpermuteInvertsIt) {
  const MoeRouteDims d = Dims(300, 8, 2, 50, MoeScore::kSigmoid);
  Routed r(d);
  const std::vector<float> logits = Random(d.tokens * d.num_experts, 3, 2.0f);
  reference::MoeRoute(d, logits.data(), nullptr, r.expert.data(), r.weight.data(), r.scores.data(),
                      r.probs.data(), r.row_of.data(), r.assignment_of.data(), r.counts.data(),
                      r.prob_sum.data());
  int64_t kept = 0, routed = 0;
  for (int64_t e = 0; e < d.num_experts; ++e) {
    EXPECT_LE(r.counts[e], d.capacity);
    EXPECT_EQ(r.counts[e], std::min<int64_t>(r.counts[d.num_experts + e], d.capacity));
    kept += r.counts[e];
    routed += r.counts[d.num_experts + e];
  }
  EXPECT_EQ(routed, d.tokens * d.top_k);
  for (int64_t row = 0; row < kept; ++row) {
    const int32_t a = r.assignment_of[row];
    EXPECT_EQ(r.row_of[a], row);
    if (row > 0) {
      const int32_t prev = r.assignment_of[row - 1];
      EXPECT_TRUE(r.expert[prev] < r.expert[a] || (r.expert[prev] == r.expert[a] && prev < a))
          << "row " << row;
    }
  }
  // Weight 1: each token gets its row once per kept choice.
  const int64_t width = 5;
  std::vector<float> x(d.tokens * width), permuted(kept * width), back(d.tokens * width, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97);
  reference::MoePermute(kept, d.top_k, width, x.data(), r.assignment_of.data(), nullptr,
                        permuted.data());
  reference::MoeUnpermute(d.tokens, d.top_k, width, permuted.data(), r.row_of.data(), nullptr,
                          back.data());
  for (int64_t t = 0; t < d.tokens; ++t) {
    int kept_choices = 0;
    for (int64_t j = 0; j < d.top_k; ++j) kept_choices += r.row_of[t * d.top_k + j] >= 0;
    for (int64_t c = 0; c < width; ++c) {
      EXPECT_EQ(back[t * width + c], kept_choices * x[t * width + c]) << "token " << t;
    }
  }
}

}  // namespace
}  // namespace loom::kernels
