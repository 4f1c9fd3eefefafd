// The vocabulary-parallel ops of the CPU backend (EmbeddingShard*,
// CrossEntropyShard*) against their plain references, and the property the
// model relies on: the shards, combined as the model combines them, give the
// unsharded embedding and cross-entropy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/reference/loss_optim.h"
#include "kernels/reference/vocab_parallel.h"

namespace loom::kernels {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<int32_t> Ids(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(gen);
  return v;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - double(b[i])));
  return d;
}

// Vocabulary 53 in three uneven shards; dims past one 64-column chunk.
constexpr int64_t kVocab = 53, kDim = 70, kTokens = 41;
const int64_t kShardFirst[] = {0, 17, 35};
const int64_t kShardSize[] = {17, 18, 18};

TEST(VocabParallelOpsTest, EmbeddingShardsMatchReferenceAndSumToTheLookup) {
  cpu::CpuOps ops(2);
  const std::vector<float> table = Random(kVocab * kDim, 1, 1.0f);
  const std::vector<int32_t> ids = Ids(kTokens, kVocab, 2);
  const std::vector<float> d_out = Random(kTokens * kDim, 3, 1.0f);
  std::vector<float> full(kTokens * kDim), sum(kTokens * kDim, 0.0f);
  ops.EmbeddingForward(ids.data(), kTokens, table.data(), kVocab, kDim, full.data());
  std::vector<float> d_full(kVocab * kDim, 0.0f);
  ops.EmbeddingBackward(ids.data(), kTokens, d_out.data(), kVocab, kDim, d_full.data());
  for (int s = 0; s < 3; ++s) {
    const float* shard = table.data() + kShardFirst[s] * kDim;
    std::vector<float> out(kTokens * kDim, 7.0f), ref(kTokens * kDim);
    ops.EmbeddingShardForward(ids.data(), kTokens, shard, kShardFirst[s], kShardSize[s], kDim,
                              out.data());
    reference::EmbeddingShardForward(ids.data(), kTokens, shard, kShardFirst[s], kShardSize[s],
                                     kDim, ref.data());
    EXPECT_EQ(out, ref) << "shard " << s;
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];

    std::vector<float> d_shard(kShardSize[s] * kDim, 0.5f), d_ref(kShardSize[s] * kDim, 0.5f);
    ops.EmbeddingShardBackward(ids.data(), kTokens, d_out.data(), kShardFirst[s], kShardSize[s],
                               kDim, d_shard.data());
    reference::EmbeddingShardBackward(ids.data(), kTokens, d_out.data(), kShardFirst[s],
                                      kShardSize[s], kDim, d_ref.data());
    EXPECT_LE(MaxAbsDiff(d_shard, d_ref), 1e-6) << "shard " << s;
    // Minus the 0.5 it started from, the shard is its rows of the full gradient.
    for (int64_t i = 0; i < kShardSize[s] * kDim; ++i) {
      ASSERT_NEAR(d_shard[i] - 0.5f, d_full[kShardFirst[s] * kDim + i], 1e-5) << i;
    }
  }
  EXPECT_EQ(sum, full);
}

TEST(VocabParallelOpsTest, CrossEntropyShardsCombineToTheFullSoftmax) {
  cpu::CpuOps ops(2);
  const std::vector<float> logits = Random(kTokens * kVocab, 4, 6.0f);
  std::vector<int32_t> targets = Ids(kTokens, kVocab, 5);
  targets[2] = -1;
  targets[9] = 0;
  targets[10] = kVocab - 1;
  const float grad_scale = 0.25f;
  // The unsharded op.
  std::vector<float> full_grad = logits, full_loss(kTokens);
  ops.CrossEntropyForwardBackward(full_grad.data(), targets.data(), kTokens, kVocab, grad_scale,
                                  full_loss.data());

  std::vector<std::vector<float>> shard_logits(3), lse(3), tgt(3);
  for (int s = 0; s < 3; ++s) {
    shard_logits[s].resize(kTokens * kShardSize[s]);
    for (int64_t r = 0; r < kTokens; ++r)
      for (int64_t c = 0; c < kShardSize[s]; ++c)
        shard_logits[s][r * kShardSize[s] + c] = logits[r * kVocab + kShardFirst[s] + c];
    lse[s].resize(kTokens);
    tgt[s].resize(kTokens);
    std::vector<float> ref_lse(kTokens), ref_tgt(kTokens);
    ops.CrossEntropyShardStats(shard_logits[s].data(), targets.data(), kTokens, kShardFirst[s],
                               kShardSize[s], lse[s].data(), tgt[s].data());
    reference::CrossEntropyShardStats(shard_logits[s].data(), targets.data(), kTokens,
                                      kShardFirst[s], kShardSize[s], ref_lse.data(),
                                      ref_tgt.data());
    EXPECT_LE(MaxAbsDiff(lse[s], ref_lse), 2e-6) << "shard " << s;
    EXPECT_EQ(tgt[s], ref_tgt) << "shard " << s;
  }
  std::vector<float> global_lse(kTokens);
  for (int64_t r = 0; r < kTokens; ++r) {
    double m = -std::numeric_limits<double>::infinity(), sum = 0, target_logit = 0;
    for (int s = 0; s < 3; ++s) m = std::max(m, double(lse[s][r]));
    for (int s = 0; s < 3; ++s) {
      sum += std::exp(double(lse[s][r]) - m);
      target_logit += tgt[s][r];
    }
    global_lse[r] = static_cast<float>(m + std::log(sum));
    const double loss = targets[r] < 0 ? 0.0 : global_lse[r] - target_logit;
    EXPECT_NEAR(loss, full_loss[r], 2e-5 * std::max(1.0, std::abs(double(full_loss[r])))) << r;
  }
  for (int s = 0; s < 3; ++s) {
    std::vector<float> grad = shard_logits[s], ref = shard_logits[s];
    ops.CrossEntropyShardBackward(grad.data(), targets.data(), kTokens, kShardFirst[s],
                                  kShardSize[s], global_lse.data(), grad_scale);
    reference::CrossEntropyShardBackward(ref.data(), targets.data(), kTokens, kShardFirst[s],
                                         kShardSize[s], global_lse.data(), grad_scale);
    EXPECT_LE(MaxAbsDiff(grad, ref), 1e-7) << "shard " << s;
    for (int64_t r = 0; r < kTokens; ++r)
      for (int64_t c = 0; c < kShardSize[s]; ++c)
        ASSERT_NEAR(grad[r * kShardSize[s] + c], full_grad[r * kVocab + kShardFirst[s] + c], 1e-7)
            << "row " << r << " column " << kShardFirst[s] + c;
  }
}

TEST(VocabParallelOpsTest, AnEmptyShardContributesNothing) {
  cpu::CpuOps ops(1);
  const std::vector<int32_t> targets = {3, -1};
  float lse[2], tgt[2];
  float no_logits = 0.0f;
  ops.CrossEntropyShardStats(&no_logits, targets.data(), 2, 5, 0, lse, tgt);
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(tgt[0], 0.0f);
  EXPECT_EQ(tgt[1], 0.0f);
}

}  // namespace
}  // namespace loom::kernels
