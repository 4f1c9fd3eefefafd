// dp2 x ZeRO-{0,1,2,3} against one process: after 10 steps of a tiny model
// (two micro-batches per rank, so accumulation is exercised) the losses and
// every parameter agree within 1e-5 relative; replicas agree bit for bit;
// the same layout run twice gives the same bits.
#include <cmath>
#include <cstdio>

#include "gtest/gtest.h"
#include "tests/engine_parallel/dp_harness.h"

namespace loom::engine {
namespace {

using testing::MaxRelativeError;
using testing::ParallelJob;
using testing::RunDataParallel;
using testing::RunSingle;

class ZeroEquivalenceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { testing::WriteFile(dir_ / "train.txt", testing::SyntheticText(20000, 1)); }
  testing::ScratchDir dir_;
};

void ExpectMatchesSingle(const spec::JobSpec& job, int dp, int64_t steps) {
  const testing::RankResult want = RunSingle(job, steps);
  const std::vector<testing::RankResult> got = RunDataParallel(job, dp, steps);
  ASSERT_EQ(want.losses.size(), static_cast<size_t>(steps));
  for (int r = 0; r < dp; ++r) {
    ASSERT_EQ(got[r].losses.size(), static_cast<size_t>(steps));
    for (int64_t i = 0; i < steps; ++i) {
      EXPECT_EQ(got[r].losses[i], got[0].losses[i]);
      EXPECT_NEAR(got[r].losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i]))
          << "rank " << r << " step " << i + 1;
      EXPECT_NEAR(got[r].norms[i], want.norms[i], 1e-4 * want.norms[i]);
    }
    ASSERT_EQ(got[r].params.size(), want.params.size());
    EXPECT_EQ(got[r].params, got[0].params) << "replicas differ";
    const double err = MaxRelativeError(got[r].params, want.params);
    EXPECT_LT(err, 1e-5) << "rank " << r;
    if (r == 0) std::printf("dp%d: parameters max relative error %.3g\n", dp, err);
  }
  // Training moved the parameters far more than the tolerance.
  const testing::RankResult start = RunSingle(job, 0);
  EXPECT_GT(MaxRelativeError(start.params, want.params), 1e-3);
}

TEST_P(ZeroEquivalenceTest, Dp2MatchesOneProcess) {
  ExpectMatchesSingle(ParallelJob(dir_ / "train.txt", GetParam()), 2, 10);
}

TEST_P(ZeroEquivalenceTest, TiedEmbeddingsAndClippingDp2) {
  spec::JobSpec job = ParallelJob(dir_ / "train.txt", GetParam());
  job.model.tie_embeddings = true;
  job.train.grad_clip = 0.05;  // small enough to clip every step
  ExpectMatchesSingle(job, 2, 4);
}

TEST_P(ZeroEquivalenceTest, Dp4WithPaddedShards) {
  spec::JobSpec job = ParallelJob(dir_ / "train.txt", GetParam());
  job.model.vocab_size = 255;  // odd sizes: chunks need padding
  job.model.hidden_size = 36;
  job.model.num_heads = 2;
  job.model.num_kv_heads = 1;
  job.model.ffn_hidden_size = 50;
  ExpectMatchesSingle(job, 4, 3);
}

TEST_P(ZeroEquivalenceTest, SameLayoutSameBits) {
  const spec::JobSpec job = ParallelJob(dir_ / "train.txt", GetParam());
  const auto a = RunDataParallel(job, 2, 4);
  const auto b = RunDataParallel(job, 2, 4);
  EXPECT_EQ(a[0].losses, b[0].losses);
  EXPECT_EQ(a[0].norms, b[0].norms);
  EXPECT_EQ(a[0].params, b[0].params);
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroEquivalenceTest, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

TEST(ZeroSpecTest, RefusesBadStage) {
  testing::ScratchDir dir;
  testing::WriteFile(dir / "train.txt", testing::SyntheticText(20000, 1));
  spec::JobSpec job = ParallelJob(dir / "train.txt", 4);
  auto loop = TrainingLoop::Create(job);
  ASSERT_FALSE(loop.ok());
  EXPECT_NE(loop.status().message().find("parallelism.zero_stage=4"), std::string::npos);
}

}  // namespace
}  // namespace loom::engine
