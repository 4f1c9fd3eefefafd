// Data parallelism and ZeRO 0..3 on "device" memory: dp ranks as threads, each
// on DeviceEmulationOps (addresses that fault on any host access) with its
// collectives through DeviceEmulationCommunicator (which, like NCCL, accepts
// only that memory). Against the same layout on CpuOps with plain Gloo
// communicators every loss, gradient norm, learning rate, validation loss and
// final parameter is identical bit for bit, and both agree with one process
// within the tolerance of tests/engine_parallel. Sharded checkpoints saved on
// the device are byte-identical to the CPU's and resume bit for bit.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/test_util.h"
#include "tests/engine_device/dp_device_harness.h"
#include "tests/engine_device/expect_bitwise.h"

namespace loom::engine {
namespace {

using testing::DpRankResult;
using testing::ExpectSameBits;
using testing::ExpectSameSteps;
using testing::RunDp;

constexpr int64_t kSteps = 6;
constexpr double kGradClip = 0.05;  // small enough to clip on most steps

class DpDeviceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    testing::WriteTinyCorpus(dir_);
  }

  // Two micro-batches per rank at dp2 (accumulation), clipping, evaluation
  // every 3 steps (its all-reduce too); tied embeddings at odd stages.
  spec::JobSpec Job(int stage) const {
    spec::JobSpec job = testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt");
    job.train.steps = kSteps;
    job.train.eval_interval = 3;
    job.train.grad_clip = kGradClip;
    job.parallelism.zero_stage = stage;
    job.model.tie_embeddings = stage % 2 == 1;
    return job;
  }

  // Device against CPU on the same layout, rank by rank, bit for bit.
  static void ExpectDeviceMatchesCpu(const std::vector<DpRankResult>& dev,
                                     const std::vector<DpRankResult>& cpu, int stage) {
    ASSERT_EQ(dev.size(), cpu.size());
    for (size_t r = 0; r < dev.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      ExpectSameSteps(dev[r].steps, cpu[r].steps, 0);
      ExpectSameBits(dev[r].params, cpu[r].params);
      ExpectSameBits(dev[r].params, dev[0].params);  // replicas agree
      // The device path really ran: collectives on device memory, the
      // optimizer and the norm through the backend.
      EXPECT_GT(dev[r].forwarded, 0);
      EXPECT_GT(dev[r].counters.sum_squares, 0);
      if (stage >= 1) {
        EXPECT_GT(dev[r].counters.adamw, 0);
      }
    }
  }

  testing::ScratchDir dir_;
};

TEST_P(DpDeviceTest, Dp2BitIdenticalToCpuAndCloseToOneProcess) {
  const int stage = GetParam();
  const spec::JobSpec job = Job(stage);
  const std::vector<DpRankResult> cpu = RunDp(job, 2, kSteps, /*device=*/false);
  const std::vector<DpRankResult> dev = RunDp(job, 2, kSteps, /*device=*/true);
  ExpectDeviceMatchesCpu(dev, cpu, stage);

  // One process (CpuOps), as tests/engine_parallel compares.
  auto single = TrainingLoop::Create(job);
  ASSERT_TRUE(single.ok()) << single.status();
  int clipped = 0, evaluated = 0;
  for (const StepProgress& d : dev[0].steps) {
    auto p = (*single)->TrainStep();
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_NEAR(d.loss, p->loss, 1e-5 * std::abs(p->loss)) << "step " << p->step;
    EXPECT_NEAR(d.grad_norm, p->grad_norm, 1e-4 * p->grad_norm) << "step " << p->step;
    clipped += p->grad_norm > kGradClip ? 1 : 0;
    evaluated += d.val_loss.has_value() ? 1 : 0;
  }
  std::vector<float> want;
  ASSERT_TRUE((*single)->GatherParameters(&want).ok());
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(dev[0].params[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  EXPECT_LT(diff / scale, 1e-5);
  EXPECT_GT(clipped, 0);
  EXPECT_EQ(evaluated, 2);
}

// Checkpoints at ZeRO 1 (whole parameters from rank 0) and 3 (parameter shards).
class DpDeviceCheckpointTest : public DpDeviceTest {};

TEST_P(DpDeviceCheckpointTest, ShardedCheckpointSavedOnDeviceResumesBitForBit) {
  const int stage = GetParam();
  const spec::JobSpec job = Job(stage);
  const std::string cpu_root = dir_ / "cpu", dev_root = dir_ / "dev";
  constexpr int64_t kSaveAt = 3;
  auto save_at = [kSaveAt](const std::string& root) {
    return [root, kSaveAt](int rank, TrainingLoop& loop) {
      if (loop.step() != kSaveAt) return;
      auto dir = loop.SaveCheckpoint(root);
      ASSERT_TRUE(dir.ok()) << dir.status();
      EXPECT_EQ(dir->empty(), rank != 0);
    };
  };
  const std::vector<DpRankResult> straight = RunDp(job, 2, kSteps, false, {}, save_at(cpu_root));
  RunDp(job, 2, kSaveAt, /*device=*/true, {}, save_at(dev_root));

  // Every shard file the device wrote equals the CPU's, byte for byte.
  const std::filesystem::path step = "step_00000003";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(cpu_root) / step)) {
    if (entry.path().extension() != ".safetensors") continue;
    const std::string name = entry.path().filename();
    const std::string a = testing::ReadFile(std::filesystem::path(dev_root) / step / name);
    EXPECT_FALSE(a.empty()) << name;
    EXPECT_TRUE(a == testing::ReadFile(entry.path())) << name << " differs from the CPU's";
    ++files;
  }
  EXPECT_EQ(files, stage == 3 ? 4 : 3);  // model shards or whole model, two moment shards

  // A fresh device group resumes at step 3 and ends where the CPU run did.
  const std::vector<DpRankResult> resumed =
      RunDp(job, 2, kSteps, /*device=*/true, [&](int, TrainingLoop& loop) {
        auto loaded = loop.RestoreNewest(dev_root);
        ASSERT_TRUE(loaded.ok()) << loaded.status();
        EXPECT_EQ(loaded->step, kSaveAt);
      });
  for (size_t r = 0; r < resumed.size(); ++r) {
    ExpectSameSteps(resumed[r].steps, straight[r].steps, kSaveAt);
    ExpectSameBits(resumed[r].params, straight[r].params);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, DpDeviceTest, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });
INSTANTIATE_TEST_SUITE_P(Stages, DpDeviceCheckpointTest, ::testing::Values(1, 3),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

// dp4 with odd sizes (every bucket's chunks padded) under ZeRO-3: the padded
// staging of reduce-scatter and all-gather is device memory too.
TEST(DpDeviceDp4Test, Dp4PaddedShardsZero3BitIdenticalToCpu) {
  testing::ScratchDir dir;
  testing::WriteFile(dir / "train.txt", testing::SyntheticText(20000, 1));
  spec::JobSpec job = testing::TinyJob(dir / "train.txt", "");
  job.train.steps = 3;
  job.train.eval_interval = 0;
  job.parallelism.zero_stage = 3;
  job.model.vocab_size = 255;
  job.model.hidden_size = 36;
  job.model.num_heads = 2;
  job.model.num_kv_heads = 1;
  job.model.ffn_hidden_size = 50;
  const std::vector<DpRankResult> cpu = RunDp(job, 4, 3, false);
  const std::vector<DpRankResult> dev = RunDp(job, 4, 3, true);
  ASSERT_EQ(dev.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(dev[r].steps.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(dev[r].steps[i].loss, cpu[r].steps[i].loss);
      EXPECT_EQ(dev[r].steps[i].grad_norm, cpu[r].steps[i].grad_norm);
    }
    ASSERT_EQ(dev[r].params.size(), cpu[r].params.size());
    EXPECT_EQ(0, std::memcmp(dev[r].params.data(), cpu[r].params.data(),
                             cpu[r].params.size() * sizeof(float)));
    EXPECT_GT(dev[r].forwarded, 0);
  }
}

}  // namespace
}  // namespace loom::engine
