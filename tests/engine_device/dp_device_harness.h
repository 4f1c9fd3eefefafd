// Data-parallel ranks as threads of the test process, on either backend:
// CpuOps with plain Gloo communicators (loopback), or DeviceEmulationOps with
// the same communicators behind DeviceEmulationCommunicator, so every tensor
// and every collective buffer must be the (faulting) emulated device memory.
// Collects what the device tests compare bit for bit.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine_device/device_emulation_communicator.h"
#include "tests/engine_device/device_emulation_ops.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/training_loop.h"

namespace loom::engine::testing {

struct DpRankResult {
  std::vector<StepProgress> steps;
  std::vector<float> params;  // every parameter, flat order, after the last step
  DeviceEmulationOps::Counters counters;  // device runs only
  int64_t forwarded = 0;                  // collectives through the device communicator
};

using DpRankHook = std::function<void(int rank, TrainingLoop& loop)>;

// Trains up to `steps` on dp ranks; before_train runs after creation (e.g.
// restore), after_step after every step.
inline std::vector<DpRankResult> RunDp(const spec::JobSpec& job, int dp, int64_t steps,
                                       bool device, const DpRankHook& before_train = {},
                                       const DpRankHook& after_step = {}) {
  comm::InProcessStore store;
  std::vector<std::shared_ptr<DeviceEmulationOps>> ops(dp);
  std::vector<const DeviceEmulationOps*> raw(dp);
  for (int r = 0; r < dp && device; ++r) {
    ops[r] = std::make_shared<DeviceEmulationOps>(kernels::cpu::MakeCpuOps());
    raw[r] = ops[r].get();
  }
  auto comms = comm::testing::MakeGroup(store, dp, absl::Seconds(60), "dp");
  if (device) comms = WrapGroup(std::move(comms), raw);
  std::vector<DpRankResult> out(dp);
  comm::testing::RunRanks(comms, [&](int rank, comm::Communicator& c) {
    std::shared_ptr<kernels::Ops> backend =
        device ? std::shared_ptr<kernels::Ops>(ops[rank])
               : std::shared_ptr<kernels::Ops>(kernels::cpu::MakeCpuOps());
    auto loop = TrainingLoop::Create(job, rank, dp, &c, nullptr, nullptr, backend);
    ASSERT_TRUE(loop.ok()) << loop.status();
    if (before_train) before_train(rank, **loop);
    while ((*loop)->step() < steps) {
      auto p = (*loop)->TrainStep();
      ASSERT_TRUE(p.ok()) << p.status();
      out[rank].steps.push_back(*p);
      if (after_step) after_step(rank, **loop);
    }
    ASSERT_TRUE((*loop)->GatherParameters(&out[rank].params).ok());
    if (device) {
      out[rank].counters = ops[rank]->counters();
      out[rank].forwarded = static_cast<DeviceEmulationCommunicator&>(c).forwarded();
    }
  });
  return out;
}

}  // namespace loom::engine::testing
