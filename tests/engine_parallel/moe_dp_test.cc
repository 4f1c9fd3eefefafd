// [moe] A mixture-of-experts model under data parallelism (docs/moe.md): dp2
// x ZeRO-{0,1,3} against one process, with the auxiliary loss, a capacity
// factor and the auxiliary-loss-free bias: losses, every parameter, the
// selection biases (moved by loads summed over the DP group) and the step's
// expert statistics agree, replicas bit for bit; and a resumed run keeps its
// biases.
#include <cmath>
#include <cstdio>

#include "gtest/gtest.h"
#include "tests/engine_parallel/dp_harness.h"

namespace loom::engine {
namespace {

using testing::MaxRelativeError;

spec::JobSpec MoeJob(const std::string& train, int zero_stage) {
  spec::JobSpec job = testing::ParallelJob(train, zero_stage);
  job.train.steps = 6;
  spec::MoeSpec& e = job.model.moe;
  e.num_experts = 4;
  e.top_k = 2;
  e.expert_ffn_hidden_size = 32;
  e.num_shared_experts = 1;
  e.router_score = spec::RouterScoreKind::kSigmoid;
  e.aux_loss_coef = 0.01;
  e.bias_update_rate = 0.01;
  e.capacity_factor = 1.5;
  return job;
}

struct MoeRun {
  std::vector<float> biases;  // after the last step
  std::vector<MoeSummary> steps;
};

std::vector<float> Biases(TrainingLoop& loop) {
  std::vector<float> out;
  for (const TensorView& b : loop.model().ExpertBiases()) out.insert(out.end(), b.data, b.data + b.numel());
  return out;
}

class MoeDataParallelTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { testing::WriteFile(dir_ / "train.txt", testing::SyntheticText(20000, 3)); }
  testing::ScratchDir dir_;
};

TEST_P(MoeDataParallelTest, Dp2MatchesOneProcess) {
  const spec::JobSpec job = MoeJob(dir_ / "train.txt", GetParam());
  const int64_t steps = job.train.steps;
  // One process, with its biases and statistics.
  MoeRun single;
  testing::RankResult want;
  {
    auto loop = TrainingLoop::Create(job);
    ASSERT_TRUE(loop.ok()) << loop.status();
    while ((*loop)->step() < steps) {
      auto p = (*loop)->TrainStep();
      ASSERT_TRUE(p.ok()) << p.status();
      ASSERT_TRUE(p->moe.has_value());
      want.losses.push_back(p->loss);
      single.steps.push_back(*p->moe);
    }
    ASSERT_TRUE((*loop)->GatherParameters(&want.params).ok());
    single.biases = Biases(**loop);
  }
  std::vector<MoeRun> ranks(2);
  const std::vector<testing::RankResult> got = testing::RunDataParallel(
      job, 2, steps, {}, [&](int rank, TrainingLoop& loop, comm::Communicator&) {
        ranks[rank].biases = Biases(loop);
      });
  // The biases moved, so the check below is not of zeros.
  double moved = 0;
  for (float b : single.biases) moved = std::max(moved, std::abs(static_cast<double>(b)));
  EXPECT_GT(moved, 0.005);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].losses.size(), static_cast<size_t>(steps));
    for (int64_t i = 0; i < steps; ++i) {
      EXPECT_EQ(got[r].losses[i], got[0].losses[i]);
      EXPECT_NEAR(got[r].losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i]))
          << "rank " << r << " step " << i + 1;
    }
    EXPECT_EQ(got[r].params, got[0].params) << "replicas differ";
    const double err = MaxRelativeError(got[r].params, want.params);
    EXPECT_LT(err, 1e-5) << "rank " << r;
    EXPECT_EQ(ranks[r].biases, single.biases) << "rank " << r;
    if (r == 0) std::printf("moe dp2 zero%d: parameters max relative error %.3g\n", GetParam(), err);
  }
  // Statistics are of the whole global batch: every assignment counted once.
  const spec::TrainSpec& t = job.train;
  double routed = 0;
  for (double n : single.steps.back().tokens_per_expert) routed += n;
  EXPECT_EQ(routed, static_cast<double>(t.global_batch_size * t.seq_len * job.model.moe.top_k *
                                        job.model.num_layers));
}

// The selection biases travel in the checkpoint's state: a run resumed at
// step 3 selects, and so trains, bit for bit as the uninterrupted one.
TEST_F(MoeDataParallelTest, ResumeKeepsTheBiasesBitForBit) {
  const spec::JobSpec job = MoeJob(dir_ / "train.txt", 0);
  const std::string root = dir_ / "ckpt";
  auto straight = TrainingLoop::Create(job);
  ASSERT_TRUE(straight.ok()) << straight.status();
  std::vector<float> want;
  while ((*straight)->step() < 6) want.push_back((*straight)->TrainStep()->loss);
  {
    auto first = TrainingLoop::Create(job);
    ASSERT_TRUE(first.ok());
    while ((*first)->step() < 3) ASSERT_TRUE((*first)->TrainStep().ok());
    ASSERT_TRUE((*first)->SaveCheckpoint(root).ok());
  }
  auto second = TrainingLoop::Create(job);
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE((*second)->RestoreNewest(root).ok());
  const std::vector<float> restored = Biases(**second);
  EXPECT_NE(restored, std::vector<float>(restored.size(), 0.0f));
  while ((*second)->step() < 6) {
    auto p = (*second)->TrainStep();
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->loss, want[static_cast<size_t>(p->step - 1)]) << "step " << p->step;
  }
  EXPECT_EQ(Biases(**second), Biases(**straight));
}

INSTANTIATE_TEST_SUITE_P(Stages, MoeDataParallelTest, ::testing::Values(0, 1, 3),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

}  // namespace
}  // namespace loom::engine
