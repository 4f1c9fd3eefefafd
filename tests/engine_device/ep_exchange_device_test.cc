// The expert dispatcher on device memory, without a device: every buffer it
// hands to the EP group (the counts' staging for the integer all-to-all, the
// rows) must be backend memory, as NCCL requires, or the emulated
// communicator aborts naming the operation. The grouped rows must equal the
// host run's bit for bit (the exchange only copies), and Combine must give
// back exactly the rows Dispatch took.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine_device/device_emulation_communicator.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/expert_parallel/ep_exchange.h"

namespace loom::engine::testing {
namespace {

constexpr int64_t kExperts = 8, kWidth = 5;

// Rank r's rows per global expert (some zero), and the rows themselves.
std::vector<int64_t> Counts(int rank) {
  std::vector<int64_t> c(kExperts);
  for (int64_t e = 0; e < kExperts; ++e) c[e] = (rank * 3 + e * 5) % 4;
  return c;
}
std::vector<float> Rows(int rank, int64_t n) {
  std::vector<float> x(n * kWidth);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(rank) + 0.001f * static_cast<float>(i);
  return x;
}

struct Out {
  std::vector<float> grouped, back;
  int64_t forwarded = 0;
};

// One rank: plan, dispatch, combine; rows live in `ops`' memory.
Out RunRank(int rank, kernels::Ops& ops, comm::Communicator& ep) {
  auto ex = EpExpertExchange::Create(&ep, &ops, kExperts);
  EXPECT_TRUE(ex.ok()) << ex.status();
  const std::vector<int64_t> counts = Counts(rank);
  int64_t rows = 0;
  for (int64_t c : counts) rows += c;
  const std::vector<float> x = Rows(rank, rows);
  kernels::Buffer permuted = ops.AllocateFloats(rows * kWidth);
  ops.CopyHostToDevice(permuted.data(), x.data(), rows * kWidth * 4);
  ExchangePlan plan;
  EXPECT_TRUE((*ex)->Plan(counts, &plan).ok());
  kernels::Buffer grouped = ops.AllocateFloats(plan.grouped_rows * kWidth);
  kernels::Buffer back = ops.AllocateFloats(rows * kWidth);
  EXPECT_TRUE((*ex)->Dispatch(plan, permuted.f32(), kWidth, grouped.f32()).ok());
  EXPECT_TRUE((*ex)->Combine(plan, grouped.f32(), kWidth, back.f32()).ok());
  Out out;
  out.grouped.resize(plan.grouped_rows * kWidth);
  out.back.resize(rows * kWidth);
  ops.CopyDeviceToHost(out.grouped.data(), grouped.data(), plan.grouped_rows * kWidth * 4);
  ops.CopyDeviceToHost(out.back.data(), back.data(), rows * kWidth * 4);
  EXPECT_EQ(out.back, x) << "rank " << rank;
  return out;
}

TEST(EpExchangeDeviceTest, EveryExchangedBufferIsDeviceMemoryAndMatchesTheHostRun) {
  for (int ranks : {2, 4}) {
    std::vector<Out> host(ranks), device(ranks);
    {
      comm::InProcessStore store;
      auto comms = comm::testing::MakeGroup(store, ranks, absl::Seconds(30), "ep");
      comm::testing::RunRanks(comms, [&](int r, comm::Communicator& c) {
        auto ops = kernels::cpu::MakeCpuOps(1);
        host[r] = RunRank(r, *ops, c);
      });
    }
    comm::InProcessStore store;
    std::vector<std::unique_ptr<DeviceEmulationOps>> ops;
    std::vector<const DeviceEmulationOps*> raw;
    for (int r = 0; r < ranks; ++r) {
      ops.push_back(std::make_unique<DeviceEmulationOps>(kernels::cpu::MakeCpuOps(1)));
      raw.push_back(ops.back().get());
    }
    auto comms = WrapGroup(comm::testing::MakeGroup(store, ranks, absl::Seconds(30), "ep"), raw);
    comm::testing::RunRanks(comms, [&](int r, comm::Communicator& c) {
      device[r] = RunRank(r, *ops[r], c);
      device[r].forwarded = static_cast<DeviceEmulationCommunicator&>(c).forwarded();
    });
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(device[r].grouped, host[r].grouped) << ranks << " ranks, rank " << r;
      EXPECT_EQ(device[r].forwarded, 3);  // the counts, dispatch, combine
    }
  }
}

}  // namespace
}  // namespace loom::engine::testing
