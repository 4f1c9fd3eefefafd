// The single-rank training path on "device" memory: DeviceEmulationOps hands
// out addresses that fault on any host access and refuses host memory where an
// op needs device memory, so a run that finishes proves the engine reaches
// parameters, gradients, optimizer states and activations only through Ops.
// Against CpuOps (the same arithmetic on host memory) every loss, gradient
// norm, validation loss, parameter and checkpoint byte must be identical.
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "export/hf_export.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/engine/test_util.h"
#include "tests/engine/train_steps.h"
#include "tests/engine_device/device_emulation_ops.h"
#include "tests/engine_device/expect_bitwise.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

using ::testing::HasSubstr;
using testing::DeviceEmulationOps;
using testing::ExpectSameBits;
using testing::ExpectSameSteps;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

constexpr int64_t kSteps = 20;
constexpr double kGradClip = 0.5;

class DeviceTrainingTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    testing::WriteTinyCorpus(dir_);
  }

  // Tiny Llama, 4 micro-batches per step, clipping on, evaluation every 5
  // steps; tied embeddings as the parameter says.
  spec::JobSpec Job() const {
    spec::JobSpec job = testing::TinyJob(dir_ / "train.txt", dir_ / "val.txt");
    job.train.steps = kSteps;
    job.train.grad_clip = kGradClip;
    job.model.tie_embeddings = GetParam();
    job.checkpoint.interval = 10;
    job.checkpoint.keep = 3;
    return job;
  }

  static std::shared_ptr<DeviceEmulationOps> DeviceOps() {
    return std::make_shared<DeviceEmulationOps>(kernels::cpu::MakeCpuOps());
  }

  // A loop on `ops` (null: the spec's backend, CpuOps).
  std::unique_ptr<TrainingLoop> Make(std::shared_ptr<kernels::Ops> ops) const {
    auto loop = TrainingLoop::Create(Job(), 0, 1, nullptr, nullptr, nullptr, std::move(ops));
    EXPECT_TRUE(loop.ok()) << loop.status();
    return loop.ok() ? std::move(*loop) : nullptr;
  }

  ScratchDir dir_;
};

TEST_P(DeviceTrainingTest, TrainsBitIdenticalToCpu) {
  auto cpu = Make(nullptr);
  ASSERT_NE(cpu, nullptr);
  EXPECT_STREQ(cpu->ops().name(), "cpu");
  const testing::TrainedSteps want = testing::RunCheckpointed(*cpu, "");

  std::shared_ptr<DeviceEmulationOps> ops = DeviceOps();
  auto dev = Make(ops);
  ASSERT_NE(dev, nullptr);
  // The model, its gradients and the optimizer's moments all live on the "device".
  for (const TensorView& p : dev->model().Parameters()) {
    ASSERT_TRUE(DeviceEmulationOps::IsDevicePointer(p.data)) << p.name;
  }
  for (const TensorView& m : dev->optimizer().States()) {
    ASSERT_TRUE(DeviceEmulationOps::IsDevicePointer(m.data)) << m.name;
  }
  const testing::TrainedSteps got = testing::RunCheckpointed(*dev, "");

  ASSERT_EQ(want.steps.size(), static_cast<size_t>(kSteps));
  ExpectSameSteps(got.steps, want.steps, 0);
  ExpectSameBits(got.params, want.params);
  // Optimizer states too, read back through the backend.
  std::vector<float> m_cpu, m_dev;
  for (const TensorView& s : cpu->optimizer().States()) {
    m_cpu.insert(m_cpu.end(), s.data, s.data + s.numel());
  }
  for (const TensorView& s : dev->optimizer().States()) {
    const size_t at = m_dev.size();
    m_dev.resize(at + s.numel());
    ops->CopyDeviceToHost(m_dev.data() + at, s.data, s.numel() * 4);
  }
  ExpectSameBits(m_dev, m_cpu);

  // The run really exercised what it should: clipping fired, evaluation ran,
  // and the optimizer, norm and scaling went through the backend.
  int clipped = 0, evaluated = 0;
  for (const StepProgress& p : want.steps) {
    clipped += p.grad_norm > kGradClip ? 1 : 0;
    evaluated += p.val_loss.has_value() ? 1 : 0;
  }
  EXPECT_GT(clipped, 0);
  EXPECT_EQ(evaluated, 4);
  EXPECT_LT(want.steps.back().loss, want.steps.front().loss - 0.5);
  // Each step reports the backend's peak device bytes: at least the weights,
  // gradients and AdamW moments (4 copies of the parameters), which the host
  // backend does not report at all.
  int64_t parameter_bytes = 0;
  for (const TensorView& v : dev->model().Parameters()) parameter_bytes += v.numel() * 4;
  for (size_t i = 0; i < got.steps.size(); ++i) {
    EXPECT_EQ(want.steps[i].peak_device_bytes, 0) << "step " << i + 1;
    EXPECT_GE(got.steps[i].peak_device_bytes, 4 * parameter_bytes) << "step " << i + 1;
    EXPECT_LE(got.steps[i].peak_device_bytes, ops->device_memory()->allocated_bytes * 4)
        << "step " << i + 1;
  }
  const DeviceEmulationOps::Counters c = ops->counters();
  const int64_t tensors = static_cast<int64_t>(dev->model().Parameters().size());
  EXPECT_EQ(c.adamw, kSteps * tensors);
  EXPECT_EQ(c.sum_squares, kSteps * tensors);
  EXPECT_EQ(c.scale, clipped * tensors);
  EXPECT_GT(c.host_to_device_bytes, 0);
  EXPECT_GT(c.device_to_host_bytes, 0);
}

TEST_P(DeviceTrainingTest, CheckpointResumeAndExportOnDevice) {
  const std::string cpu_root = dir_ / "cpu_ckpt", dev_root = dir_ / "dev_ckpt";
  auto cpu = Make(nullptr);
  ASSERT_NE(cpu, nullptr);
  const testing::TrainedSteps straight = testing::RunCheckpointed(*cpu, cpu_root);  // saves steps 10 and 20
  ASSERT_EQ(straight.steps.size(), static_cast<size_t>(kSteps));

  {  // Steps 1..10 on the device, saved at 10 (staged through host copies).
    auto first = Make(DeviceOps());
    ASSERT_NE(first, nullptr);
    const testing::TrainedSteps part =
        testing::RunCheckpointed(*first, dev_root, /*stop_after=*/10);
    ASSERT_EQ(part.steps.size(), 10u);
    for (size_t i = 0; i < part.steps.size(); ++i) {
      EXPECT_EQ(part.steps[i].loss, straight.steps[i].loss) << "step " << i + 1;
    }
  }
  // The device wrote the same tensors, byte for byte, as the CPU did.
  for (const char* file : {"model-r00000.safetensors", "optimizer-r00000.safetensors"}) {
    const std::string a = ReadFile(dev_root + "/step_00000010/" + file);
    const std::string b = ReadFile(cpu_root + "/step_00000010/" + file);
    ASSERT_FALSE(a.empty()) << file;
    EXPECT_TRUE(a == b) << file << " differs between the device and the CPU run";
  }

  // A fresh device loop resumes at step 10 and ends where the straight run did.
  std::shared_ptr<DeviceEmulationOps> ops = DeviceOps();
  auto second = Make(ops);
  ASSERT_NE(second, nullptr);
  const testing::TrainedSteps rest = testing::RunCheckpointed(*second, dev_root);
  EXPECT_EQ(second->step(), kSteps);
  ExpectSameSteps(rest.steps, straight.steps, 10);
  ExpectSameBits(rest.params, straight.params);
  EXPECT_GT(ops->counters().host_to_device_bytes, 0);

  // A CPU checkpoint loads onto the device (and back: the formats are one).
  auto third = Make(DeviceOps());
  ASSERT_NE(third, nullptr);
  auto loaded = third->RestoreNewest(cpu_root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, kSteps);
  std::vector<float> params;
  ASSERT_TRUE(third->GatherParameters(&params).ok());
  ExpectSameBits(params, straight.params);

  // Export of the device's checkpoint equals the CPU's.
  ASSERT_TRUE(hf_export::ExportHuggingFace(dev_root, dir_ / "hf_dev").ok());
  ASSERT_TRUE(hf_export::ExportHuggingFace(cpu_root, dir_ / "hf_cpu").ok());
  const std::string exported = ReadFile(dir_ / "hf_dev/model.safetensors");
  EXPECT_FALSE(exported.empty());
  EXPECT_TRUE(exported == ReadFile(dir_ / "hf_cpu/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "hf_dev/config.json"));
}

INSTANTIATE_TEST_SUITE_P(Embeddings, DeviceTrainingTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Tied") : std::string("Untied");
                         });

// The emulation really faults: a host read of its memory dies, and so does
// handing host memory to an op that needs device memory.
TEST(DeviceEmulationOpsTest, HostAccessFaultsAndHostPointersAreRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceEmulationOps ops(kernels::cpu::MakeCpuOps(1));
  kernels::Buffer buffer = ops.AllocateFloats(16);
  ASSERT_TRUE(DeviceEmulationOps::IsDevicePointer(buffer.data()));
  const std::vector<float> host(16, 2.0f);
  ops.CopyHostToDevice(buffer.data(), host.data(), 64);
  EXPECT_EQ(ops.SumSquares(buffer.f32(), 16), 64.0);
  std::vector<float> back(16);
  ops.CopyDeviceToHost(back.data(), buffer.data(), 64);
  EXPECT_EQ(back, host);
  EXPECT_DEATH(
      {
        volatile float* p = buffer.f32();
        std::fprintf(stderr, "read %f\n", static_cast<double>(p[3]));
      },
      "");
  std::vector<float> other(16);
  EXPECT_DEATH(ops.Fill(other.data(), 16, 0.0f), "Fill: argument x = .* is host memory");
  EXPECT_DEATH(ops.CopyHostToDevice(buffer.data(), buffer.data(), 4),
               "CopyHostToDevice: argument src = .* is backend");
  float* dangling = nullptr;
  {
    kernels::Buffer gone = ops.AllocateFloats(4);
    dangling = gone.f32();
  }
  EXPECT_DEATH(ops.Scale(4, 2.0f, dangling), "not inside any live allocation");
  EXPECT_EQ(ops.counters().live_allocations, 1);
}

}  // namespace
}  // namespace loom::engine
