// The backend chosen for a job (worker/engine/ops_selection.h), and what a
// GPU job reports where the CUDA backend cannot be had.
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"
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

  auto bf16 = MakeOpsForJob(Job(spec::DeviceKind::kCpu, spec::Precision::kBf16));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_STREQ((*bf16)->name(), "cpu-bf16-emulation");
  EXPECT_EQ((*bf16)->device(), kernels::DeviceType::kCpu);
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

TEST(OpsSelectionTest, GpuJobWithoutAUsableDeviceFailsWithTheBackendsReason) {
  testing::ScratchDir dir;
  testing::WriteFile(dir / "train.txt", testing::SyntheticText(5000, 1));
  testing::WriteFile(dir / "val.txt", testing::SyntheticText(2000, 2));
  spec::JobSpec job = testing::TinyJob(dir / "train.txt", dir / "val.txt");
  job.resources.device = spec::DeviceKind::kGpu;
  // Without CUDA (or a device), Create picks the CUDA backend and reports why
  // it cannot have it; with one, the job trains.
  auto loop = TrainingLoop::Create(job);
  if (!loop.ok()) {
    EXPECT_EQ(loop.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(loop.status().message(), HasSubstr("resources.device=gpu"));
  } else {
    EXPECT_EQ((*loop)->ops().device(), kernels::DeviceType::kCuda);
  }
}

}  // namespace
}  // namespace loom::engine
