// Expert parallelism on device memory, without a device: ep ranks on
// DeviceEmulationOps behind DeviceEmulationCommunicator (which aborts on any
// host pointer, as NCCL would fault) train bit for bit as the same ranks on
// CpuOps, and write a checkpoint (each EP rank its experts' pieces, copied
// down from backend memory) that one CPU process loads.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine/test_util.h"
#include "tests/engine_device/device_emulation_communicator.h"
#include "tests/engine_device/device_emulation_ops.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/training_loop.h"

namespace loom::engine::testing {
namespace {

spec::JobSpec EpJob(const std::string& train, int ep) {
  spec::JobSpec job = TinyJob(train, "");
  job.train.steps = 3;
  job.train.eval_interval = 0;
  job.parallelism.ep = ep;
  job.model.moe.num_experts = 4;
  job.model.moe.top_k = 2;
  job.model.moe.expert_ffn_hidden_size = 16;
  job.model.moe.num_shared_experts = 1;
  job.model.moe.first_dense_layers = 1;
  job.model.moe.bias_update_rate = 0.01;
  return job;
}

struct EpRank {
  std::vector<float> losses;
  std::vector<float> params;
  int64_t forwarded = 0;
};

std::vector<EpRank> RunEp(const spec::JobSpec& job, int ep, bool device, const std::string& ckpt) {
  comm::InProcessStore store;
  std::vector<std::shared_ptr<DeviceEmulationOps>> ops(ep);
  std::vector<const DeviceEmulationOps*> raw(ep);
  for (int r = 0; r < ep && device; ++r) {
    ops[r] = std::make_shared<DeviceEmulationOps>(kernels::cpu::MakeCpuOps());
    raw[r] = ops[r].get();
  }
  auto comms = comm::testing::MakeGroup(store, ep, absl::Seconds(60), "ep");
  if (device) comms = WrapGroup(std::move(comms), raw);
  std::vector<EpRank> out(ep);
  comm::testing::RunRanks(comms, [&](int rank, comm::Communicator& c) {
    std::shared_ptr<kernels::Ops> backend = device ? std::shared_ptr<kernels::Ops>(ops[rank])
                                                   : std::shared_ptr<kernels::Ops>(kernels::cpu::MakeCpuOps());
    auto ctx = ParallelContext::Make(0, 1, nullptr, nullptr, nullptr, nullptr, nullptr, &c);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    auto loop = TrainingLoop::Create(job, *ctx, backend);
    ASSERT_TRUE(loop.ok()) << loop.status();
    while (!(*loop)->done()) {
      auto p = (*loop)->TrainStep();
      ASSERT_TRUE(p.ok()) << p.status();
      out[rank].losses.push_back(p->loss);
    }
    ASSERT_TRUE((*loop)->GatherParameters(&out[rank].params).ok());
    if (!ckpt.empty()) {
      auto saved = (*loop)->SaveCheckpoint(ckpt);
      ASSERT_TRUE(saved.ok()) << saved.status();
    }
    if (device) out[rank].forwarded = static_cast<DeviceEmulationCommunicator&>(c).forwarded();
  });
  return out;
}

TEST(EpDeviceTest, EpOnDeviceMemoryMatchesTheCpuBitForBitAndCheckpoints) {
  ScratchDir dir;
  WriteFile(dir / "train.txt", SyntheticText(20000, 1));
  const spec::JobSpec job = EpJob(dir / "train.txt", 2);
  const std::vector<EpRank> cpu = RunEp(job, 2, false, "");
  const std::vector<EpRank> dev = RunEp(job, 2, true, dir / "ckpt");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(dev[r].losses.size(), 3u);
    EXPECT_EQ(dev[r].losses, cpu[r].losses) << "rank " << r;
    EXPECT_EQ(dev[r].params, cpu[r].params) << "rank " << r;
    EXPECT_GT(dev[r].forwarded, 0);
  }
  // One CPU process loads what the device ranks wrote (every expert).
  spec::JobSpec single = job;
  single.parallelism.ep = 1;
  auto loop = TrainingLoop::Create(single);
  ASSERT_TRUE(loop.ok()) << loop.status();
  auto loaded = (*loop)->RestoreNewest(dir / "ckpt");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 3);
}

}  // namespace
}  // namespace loom::engine::testing
