// Peak memory per rank from the engine's own accounting (MemoryTracker) falls
// as the ZeRO stage rises: optimizer states shard at stage 1, gradients at 2,
// parameters at 3, with the exact shard sizes where they are deterministic
// and bounds where they depend on how far the reductions lag behind backward.
#include <cstdio>

#include "gtest/gtest.h"
#include "tests/engine_parallel/dp_harness.h"

namespace loom::engine {
namespace {

TEST(ZeroMemoryTest, PeakFallsAsTheStageRises) {
  testing::ScratchDir dir;
  testing::WriteFile(dir / "train.txt", testing::SyntheticText(20000, 1));
  const int dp = 2;
  std::vector<MemoryUsage> peaks;
  int64_t N = 0, per_layer = 0, shard = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    spec::JobSpec job = testing::ParallelJob(dir / "train.txt", stage);
    job.model.num_layers = 8;  // parameters dominate; a unit is a small part of them
    job.train.steps = 2;
    N = testing::LlamaParameterCount(job.model, &per_layer);
    std::vector<int64_t> shard_sizes(dp);
    const auto runs = testing::RunDataParallel(job, dp, 2, [&](int rank, TrainingLoop& loop,
                                                               comm::Communicator&) {
      shard_sizes[rank] = loop.dp_engine()->partition().shard_size();
    });
    shard = shard_sizes[0];
    EXPECT_GT(runs[1].memory.total_peak, 0);
    peaks.push_back(runs[0].memory);
    std::printf("stage %d:\n%s", stage, FormatMemoryUsage(runs[0].memory).c_str());
  }
  const int64_t full = 4 * N;
  EXPECT_EQ(shard, N / dp);  // even sizes: no padding
  const auto peak = [&](int stage, MemoryKind k) { return peaks[stage].Peak(k); };
  // Stage 0: everything replicated.
  EXPECT_EQ(peak(0, MemoryKind::kParameters), full);
  EXPECT_EQ(peak(0, MemoryKind::kGradients), full);
  EXPECT_EQ(peak(0, MemoryKind::kOptimizerStates), 2 * full);
  // Stage 1: moments sharded.
  EXPECT_EQ(peak(1, MemoryKind::kOptimizerStates), 2 * 4 * shard);
  EXPECT_EQ(peak(1, MemoryKind::kGradients), full);
  EXPECT_EQ(peak(1, MemoryKind::kParameters), full);
  // Stage 2: the fp32 gradient shard plus the buckets backward has written
  // and not yet reduced (bounded by the reduce window: a few units).
  const int64_t unit_bytes = 4 * std::max<int64_t>(per_layer, 2 * 256 * 32);
  EXPECT_EQ(peak(2, MemoryKind::kOptimizerStates), 2 * 4 * shard);
  EXPECT_GE(peak(2, MemoryKind::kGradients), 4 * shard);
  EXPECT_LE(peak(2, MemoryKind::kGradients), 4 * shard + 4 * unit_bytes);
  EXPECT_EQ(peak(2, MemoryKind::kParameters), full);
  // Stage 3: the parameter shard plus the gathered units in use or prefetched.
  EXPECT_GE(peak(3, MemoryKind::kParameters), 4 * shard);
  EXPECT_LE(peak(3, MemoryKind::kParameters), 4 * shard + 3 * unit_bytes);
  EXPECT_LE(peak(3, MemoryKind::kGradients), 4 * shard + 4 * unit_bytes);
  // Activations do not depend on the stage.
  for (int s = 1; s <= 3; ++s) {
    EXPECT_EQ(peak(s, MemoryKind::kActivations), peak(0, MemoryKind::kActivations));
  }
  for (int s = 1; s <= 3; ++s) {
    EXPECT_LT(peaks[s].total_peak, peaks[s - 1].total_peak) << "stage " << s;
  }
}

TEST(ZeroMemoryTest, SingleRankAccountsTheUnshardedState) {
  testing::ScratchDir dir;
  testing::WriteFile(dir / "train.txt", testing::SyntheticText(20000, 1));
  spec::JobSpec job = testing::ParallelJob(dir / "train.txt", 0);
  const testing::RankResult r = testing::RunSingle(job, 1);
  const int64_t full = 4 * testing::LlamaParameterCount(job.model);
  EXPECT_EQ(r.memory.Peak(MemoryKind::kParameters), full);
  EXPECT_EQ(r.memory.Peak(MemoryKind::kGradients), full);
  EXPECT_EQ(r.memory.Peak(MemoryKind::kOptimizerStates), 2 * full);
  EXPECT_GT(r.memory.Peak(MemoryKind::kActivations), 0);
  EXPECT_EQ(r.memory.Peak(MemoryKind::kCommBuffers), 0);
}

}  // namespace
}  // namespace loom::engine
