// Context parallelism on "device" memory: each CP rank (a thread) runs the
// model on its own DeviceEmulationOps (addresses that fault on any host
// access) and its ring through a DeviceEmulationCommunicator (which, like
// NCCL, accepts only that memory). Against the same ranks on CpuOps with
// plain Gloo, the losses and the CP-summed gradients are bit-identical, so
// the ring's K/V and dK/dV buffers, its gathers and scatters and the loss's
// CP sums all stay in backend memory.
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine_device/device_emulation_communicator.h"
#include "tests/engine_device/device_emulation_ops.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/context_parallel/zigzag.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine {
namespace {

using testing::DeviceEmulationOps;

struct CpRun {
  std::vector<float> losses;  // two training micro-batches, then an evaluation
  std::vector<float> grads;   // summed over the CP group
  int64_t forwarded = 0;
};

std::vector<CpRun> RunCp(int cp, bool device) {
  spec::ModelSpec c;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 48;
  c.max_seq_len = 64;
  const int64_t batch = 2, seq = 8 * cp;
  auto z = ZigzagSplit::Make(seq, cp);
  EXPECT_TRUE(z.ok());
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<std::vector<int32_t>> inputs(3), targets(3);
  for (int i = 0; i < 3; ++i)
    for (int64_t j = 0; j < batch * seq; ++j) {
      inputs[i].push_back(token(rng));
      targets[i].push_back(j % 5 == 2 ? -1 : token(rng));
    }
  std::vector<std::shared_ptr<kernels::Ops>> ops;
  for (int r = 0; r < cp; ++r) {
    if (device) {
      ops.push_back(std::make_shared<DeviceEmulationOps>(kernels::cpu::MakeCpuOps(1)));
    } else {
      ops.push_back(std::shared_ptr<kernels::Ops>(kernels::cpu::MakeCpuOps(1)));
    }
  }
  comm::InProcessStore store;
  std::vector<std::unique_ptr<comm::Communicator>> group =
      comm::testing::MakeGroup(store, cp, absl::Seconds(60), "cp");
  if (device) {
    std::vector<const DeviceEmulationOps*> members;
    for (auto& o : ops) members.push_back(static_cast<DeviceEmulationOps*>(o.get()));
    group = testing::WrapGroup(std::move(group), members);
  }
  std::vector<CpRun> runs(cp);
  std::vector<std::thread> threads;
  for (int r = 0; r < cp; ++r) {
    threads.emplace_back([&, r] {
      TensorParallelOptions parallel;
      parallel.cp = group[r].get();
      LlamaModel model(c, spec::Recompute::kSelective, ops[r], parallel);
      model.InitParameters(5);
      model.ZeroGradients();
      for (int i = 0; i < 3; ++i) {
        const std::vector<int32_t> in = LocalTokens(*z, r, inputs[i].data(), batch);
        const std::vector<int32_t> tg = LocalTokens(*z, r, targets[i].data(), batch);
        runs[r].losses.push_back(
            i < 2 ? model.ForwardBackward(in.data(), tg.data(), batch, z->local_seq(), 0.5f)
                  : model.ForwardLoss(in.data(), tg.data(), batch, z->local_seq()));
        ASSERT_TRUE(model.status().ok()) << model.status();
      }
      // The gradient array (the views tile it) summed over CP, in backend memory.
      const std::vector<TensorView> g = model.Gradients();
      const int64_t n = model.NumParameters();
      ASSERT_TRUE(group[r]->AllReduce(std::span<float>(g.front().data, static_cast<size_t>(n))).ok());
      runs[r].grads.resize(static_cast<size_t>(n));
      ops[r]->CopyDeviceToHost(runs[r].grads.data(), g.front().data, n * static_cast<int64_t>(sizeof(float)));
      if (device) {
        runs[r].forwarded = static_cast<testing::DeviceEmulationCommunicator*>(group[r].get())->forwarded();
      }
    });
  }
  for (auto& t : threads) t.join();
  return runs;
}

TEST(CpDevice, Cp2RingRunsOnBackendMemoryBitIdenticalToCpu) {
  const std::vector<CpRun> want = RunCp(2, false), got = RunCp(2, true);
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].losses.size(), want[r].losses.size());
    EXPECT_EQ(0, std::memcmp(got[r].losses.data(), want[r].losses.data(),
                             want[r].losses.size() * sizeof(float)))
        << "rank " << r;
    ASSERT_EQ(got[r].grads.size(), want[r].grads.size());
    EXPECT_EQ(0, std::memcmp(got[r].grads.data(), want[r].grads.data(),
                             want[r].grads.size() * sizeof(float)))
        << "rank " << r;
    EXPECT_GT(got[r].forwarded, 0) << "the ring went through the device communicator";
  }
}

}  // namespace
}  // namespace loom::engine
