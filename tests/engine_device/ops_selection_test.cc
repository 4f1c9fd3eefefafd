// The backend chosen for a job (worker/engine/ops_selection.h) and the rule
// that a device backend trains only the layouts whose exchanges are backend
// memory (data parallelism, pipelines; not yet plain tensor parallelism).
#include <memory>
#include <string>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine/test_util.h"
#include "tests/engine_device/device_emulation_ops.h"
#include "worker/engine/ops_selection.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

using ::testing::HasSubstr;

spec::JobSpec Job(spec::DeviceKind device, spec::Precision precision) {
  spec::JobSpec job;
  job.resources.device = device;
  job.train.precision = precision;
  return job;
}

TEST(OpsSelectionTest, CpuBackendsByPrecision) {
  auto fp32 = MakeOpsForJob(Job(spec::DeviceKind::kCpu, spec::Precision::kFp32));
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_STREQ((*fp32)->name(), "cpu");
  EXPECT_EQ((*fp32)->device(), kernels::DeviceType::kCpu);

  auto fp8 = MakeOpsForJob(Job(spec::DeviceKind::kCpu, spec::Precision::kFp8));
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_STREQ((*fp8)->name(), "cpu-fp8-emulation");

  // bf16 on the CPU is the bf16 emulation where this build has it, else the
  // spec rules' refusal.
  auto bf16 = MakeOpsForJob(Job(spec::DeviceKind::kCpu, spec::Precision::kBf16));
  if (bf16.ok()) {
    EXPECT_EQ((*bf16)->device(), kernels::DeviceType::kCpu);
    EXPECT_STRNE((*bf16)->name(), "cpu");
  } else {
    EXPECT_EQ(bf16.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bf16.status().message(),
                HasSubstr("train.precision=bf16 is not available on resources.device=cpu"));
  }
}

TEST(OpsSelectionTest, GpuNeedsCudaAndADevice) {
  for (spec::Precision precision :
       {spec::Precision::kFp32, spec::Precision::kBf16, spec::Precision::kFp8}) {
    auto ops = MakeOpsForJob(Job(spec::DeviceKind::kGpu, precision), 0);
    if (ops.ok()) {  // a CUDA build on a machine with a GPU
      EXPECT_TRUE(BuiltWithCuda());
      EXPECT_EQ((*ops)->device(), kernels::DeviceType::kCuda);
      continue;
    }
    EXPECT_EQ(ops.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(ops.status().message(), HasSubstr("resources.device=gpu"));
    EXPECT_THAT(ops.status().message(), HasSubstr(BuiltWithCuda() ? "cannot open CUDA device 0"
                                                                  : "built without CUDA"));
  }
}

TEST(OpsSelectionTest, DeviceTrainsOneRank) {
  const spec::JobSpec gpu = Job(spec::DeviceKind::kGpu, spec::Precision::kBf16);
  EXPECT_TRUE(CheckDeviceLayout(gpu, false, 1, 1, 1).ok());
  for (auto [dp, tp, pp, axis] : {std::tuple{1, 2, 1, "tp=2"}, std::tuple{4, 2, 1, "tp=2"}}) {
    const absl::Status s = CheckDeviceLayout(gpu, false, dp, tp, pp);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr(std::string("resources.device=gpu: parallelism.") + axis +
                                       " is not supported on GPUs yet"));
  }
  // Data parallelism and ZeRO run on device memory (dp_device_test).
  EXPECT_TRUE(CheckDeviceLayout(gpu, false, 8, 1, 1).ok());
  // The pipeline (and TP inside it) runs on device memory (tp_pp_device_test).
  EXPECT_TRUE(CheckDeviceLayout(gpu, false, 1, 1, 4).ok());
  EXPECT_TRUE(CheckDeviceLayout(gpu, false, 1, 2, 2).ok());
  const spec::JobSpec cpu = Job(spec::DeviceKind::kCpu, spec::Precision::kFp32);
  EXPECT_TRUE(CheckDeviceLayout(cpu, false, 2, 2, 2).ok());
  EXPECT_FALSE(CheckDeviceLayout(cpu, /*on_device=*/true, 2, 2, 1).ok());
}

TEST(OpsSelectionTest, TrainingLoopRefusesDeviceWithSeveralRanks) {
  testing::ScratchDir dir;
  testing::WriteFile(dir / "train.txt", testing::SyntheticText(5000, 1));
  testing::WriteFile(dir / "val.txt", testing::SyntheticText(2000, 2));
  spec::JobSpec job = testing::TinyJob(dir / "train.txt", dir / "val.txt");
  job.parallelism.tp = 2;
  auto ops = std::make_shared<testing::DeviceEmulationOps>(kernels::cpu::MakeCpuOps());
  // A TP group of two (never used: refused before anything is built).
  comm::InProcessStore store;
  auto tp = comm::testing::MakeGroup(store, 2, absl::Seconds(10), "tp");
  auto loop = TrainingLoop::Create(job, 0, 1, nullptr, tp[0].get(), nullptr, ops);
  EXPECT_EQ(loop.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loop.status().message(), HasSubstr("parallelism.tp=2 is not supported on GPUs yet"));
  EXPECT_EQ(ops->counters().allocations, 0);

  // resources.device=gpu is refused the same way, whatever the build.
  job.resources.device = spec::DeviceKind::kGpu;
  auto gpu = TrainingLoop::Create(job, 0, 1, nullptr, tp[0].get());
  EXPECT_THAT(gpu.status().message(), HasSubstr("parallelism.tp=2 is not supported on GPUs yet"));
  // dp > 1 passes the device check (data parallelism runs on device memory):
  // what stops this one is the missing communicator.
  job.parallelism.tp = 1;
  auto dp = TrainingLoop::Create(job, 0, 2, nullptr, nullptr, nullptr, ops);
  EXPECT_EQ(dp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dp.status().message(), HasSubstr("needs a DP communicator"));
  // One rank on a GPU: without CUDA (or a device) the reason is the backend's.
  auto one = TrainingLoop::Create(job);
  if (!one.ok()) {
    EXPECT_EQ(one.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(one.status().message(), HasSubstr("resources.device=gpu"));
  }
}

}  // namespace
}  // namespace loom::engine
