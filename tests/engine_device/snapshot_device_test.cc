// In-place recovery's snapshots on device memory, checked without a device:
// dp2 ranks on DeviceEmulationOps (addresses that fault on any host access)
// with their collectives through DeviceEmulationCommunicator. A snapshot is
// captured through the backend's copies (the emulation faults if a piece is
// read or written on the host), is byte-identical to the same snapshot taken
// on CpuOps, and restoring it (in the same loop after two more steps, and in
// a fresh loop) continues bit for bit like the uninterrupted CPU run. ZeRO 1 (whole parameters,
// sharded moments) and 3 (sharded parameters).
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/test_util.h"
#include "tests/engine_device/dp_device_harness.h"
#include "tests/engine_device/expect_bitwise.h"
#include "worker/engine/snapshot/snapshot.h"

namespace loom::engine {
namespace {

using testing::DpRankResult;
using testing::ExpectSameBits;
using testing::ExpectSameSteps;
using testing::RunDp;

constexpr int64_t kSteps = 6;
constexpr int64_t kSnapshotStep = 2;

class SnapshotDeviceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { testing::WriteTinyCorpus(dir_); }

  spec::JobSpec Job() const {
    spec::JobSpec job = testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt");
    job.train.steps = kSteps;
    job.train.eval_interval = 3;
    job.train.grad_clip = 0.05;
    job.parallelism.zero_stage = GetParam();
    job.model.tie_embeddings = true;
    return job;
  }

  // Captures each rank's snapshot after kSnapshotStep; with `roll_back`,
  // restores it after step kSnapshotStep + 2 in the same loop.
  std::vector<DpRankResult> Run(bool device, std::vector<std::unique_ptr<Snapshot>>* taken,
                                bool roll_back) {
    taken->clear();
    for (int r = 0; r < 2; ++r) taken->push_back(std::make_unique<Snapshot>());
    std::vector<bool> rolled(2, false);
    return RunDp(Job(), 2, kSteps, device, {}, [&](int rank, TrainingLoop& loop) {
      Snapshot& mine = *(*taken)[static_cast<size_t>(rank)];
      if (loop.step() == kSnapshotStep && mine.empty()) {
        ASSERT_TRUE(loop.CaptureSnapshot(&mine, rank).ok());
      }
      if (roll_back && loop.step() == kSnapshotStep + 2 && !rolled[static_cast<size_t>(rank)]) {
        rolled[static_cast<size_t>(rank)] = true;
        absl::Status s = loop.RestoreSnapshot(mine, rank);
        ASSERT_TRUE(s.ok()) << s;
      }
    });
  }

  testing::ScratchDir dir_;
};

TEST_P(SnapshotDeviceTest, CapturedThroughTheBackendAndRestoredBitForBit) {
  std::vector<std::unique_ptr<Snapshot>> cpu_taken, dev_taken;
  const std::vector<DpRankResult> cpu = Run(/*device=*/false, &cpu_taken, /*roll_back=*/false);
  const std::vector<DpRankResult> dev = Run(/*device=*/true, &dev_taken, /*roll_back=*/true);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Snapshot& c = *cpu_taken[static_cast<size_t>(r)];
    const Snapshot& d = *dev_taken[static_cast<size_t>(r)];
    ASSERT_FALSE(d.empty());
    ASSERT_EQ(d.size_bytes(), c.size_bytes());
    EXPECT_EQ(0,
              std::memcmp(d.bytes().data(), c.bytes().data(), static_cast<size_t>(c.size_bytes())));
    // Steps 1..4, then 3..6 again after the rollback, as the straight run's.
    const std::vector<DpRankResult>::value_type& run = dev[static_cast<size_t>(r)];
    ASSERT_EQ(run.steps.size(), static_cast<size_t>(kSteps + 2));
    std::vector<StepProgress> before(run.steps.begin(), run.steps.begin() + 4);
    std::vector<StepProgress> after(run.steps.begin() + 4, run.steps.end());
    const std::vector<StepProgress>& straight = cpu[static_cast<size_t>(r)].steps;
    ExpectSameSteps(before, std::vector<StepProgress>(straight.begin(), straight.begin() + 4), 0);
    ExpectSameSteps(after, straight, kSnapshotStep);
    ExpectSameBits(run.params, cpu[static_cast<size_t>(r)].params);
  }
  // A fresh device loop restored from the snapshot.
  std::vector<DpRankResult> fresh =
      RunDp(Job(), 2, kSteps, /*device=*/true, [&](int rank, TrainingLoop& loop) {
        absl::Status s = loop.RestoreSnapshot(*dev_taken[static_cast<size_t>(rank)], rank);
        ASSERT_TRUE(s.ok()) << s;
      });
  for (int r = 0; r < 2; ++r) {
    ExpectSameSteps(fresh[static_cast<size_t>(r)].steps, cpu[static_cast<size_t>(r)].steps,
                    kSnapshotStep);
    ExpectSameBits(fresh[static_cast<size_t>(r)].params, cpu[static_cast<size_t>(r)].params);
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, SnapshotDeviceTest, ::testing::Values(1, 3),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

}  // namespace
}  // namespace loom::engine
