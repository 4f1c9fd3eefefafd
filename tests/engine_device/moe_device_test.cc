// [moe] The MoE layer on "device" memory (docs/moe.md): DeviceEmulationOps
// faults on any host access, so a run that finishes proves the router's host
// arithmetic reaches logits and gradients only through Ops copies; against
// CpuOps every loss, expert statistic and parameter must be identical.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/engine/test_util.h"
#include "tests/engine_device/device_emulation_ops.h"
#include "tests/engine_device/expect_bitwise.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

struct MoeRun {
  std::vector<float> losses;
  std::vector<double> imbalance;
  std::vector<float> params;
};

MoeRun Train(const spec::JobSpec& job, std::shared_ptr<kernels::Ops> ops) {
  MoeRun r;
  auto loop = TrainingLoop::Create(job, 0, 1, nullptr, nullptr, nullptr, std::move(ops));
  EXPECT_TRUE(loop.ok()) << loop.status();
  if (!loop.ok()) return r;
  while (!(*loop)->done()) {
    auto p = (*loop)->TrainStep();
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok() || !p->moe) return r;
    r.losses.push_back(p->loss);
    r.imbalance.push_back(p->moe->imbalance);
  }
  EXPECT_TRUE((*loop)->GatherParameters(&r.params).ok());
  return r;
}

TEST(MoeDeviceTest, TrainsBitIdenticalToCpu) {
  testing::ScratchDir dir;
  testing::WriteTinyCorpus(dir);
  spec::JobSpec job = testing::TinyJob(dir / "train.txt", dir / "val.txt");
  job.train.steps = 6;
  job.train.eval_interval = 3;
  spec::MoeSpec& e = job.model.moe;
  e.num_experts = 4;
  e.top_k = 2;
  e.expert_ffn_hidden_size = 32;
  e.num_shared_experts = 1;
  e.router_score = spec::RouterScoreKind::kSigmoid;
  e.bias_update_rate = 0.01;
  e.capacity_factor = 1.25;
  const MoeRun want = Train(job, nullptr);
  const MoeRun got = Train(job, std::make_shared<testing::DeviceEmulationOps>(kernels::cpu::MakeCpuOps()));
  ASSERT_EQ(want.losses.size(), 6u);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.imbalance, want.imbalance);
  testing::ExpectSameBits(got.params, want.params);
}

}  // namespace
}  // namespace loom::engine
