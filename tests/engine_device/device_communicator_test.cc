// DeviceEmulationCommunicator: collectives on tagged memory give the inner
// communicator's results, and host memory (or a span running past its
// allocation) aborts naming the operation and the argument, as NCCL would
// fault on a host pointer.
#include "tests/engine_device/device_emulation_communicator.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "worker/comm/in_process_store.h"

namespace loom::engine::testing {
namespace {

struct Group {
  std::vector<std::unique_ptr<DeviceEmulationOps>> ops;
  std::vector<std::unique_ptr<comm::Communicator>> comms;
};

Group MakeDeviceGroup(comm::InProcessStore& store, int n) {
  Group g;
  std::vector<const DeviceEmulationOps*> raw;
  for (int r = 0; r < n; ++r) {
    g.ops.push_back(std::make_unique<DeviceEmulationOps>(kernels::cpu::MakeCpuOps()));
    raw.push_back(g.ops.back().get());
  }
  g.comms = WrapGroup(comm::testing::MakeGroup(store, n, absl::Seconds(30), "dp"), raw);
  return g;
}

std::vector<float> Download(DeviceEmulationOps& ops, const float* p, int64_t n) {
  std::vector<float> out(n);
  ops.CopyDeviceToHost(out.data(), p, n * sizeof(float));
  return out;
}

TEST(DeviceEmulationCommunicatorTest, CollectivesOnDeviceMemoryMatchTheInnerCommunicator) {
  constexpr int kRanks = 2;
  constexpr int64_t kN = 6;
  comm::InProcessStore store;
  Group g = MakeDeviceGroup(store, kRanks);
  comm::testing::RunRanks(g.comms, [&](int rank, comm::Communicator& c) {
    DeviceEmulationOps& ops = *g.ops[rank];
    kernels::Buffer a = ops.Allocate(kN * sizeof(float));
    kernels::Buffer b = ops.Allocate(kN * kRanks * sizeof(float));
    auto* pa = static_cast<float*>(a.data());
    auto* pb = static_cast<float*>(b.data());
    std::vector<float> host(kN);
    for (int64_t i = 0; i < kN; ++i) host[i] = static_cast<float>(rank * 10 + i);
    ops.CopyHostToDevice(pa, host.data(), kN * sizeof(float));

    ASSERT_TRUE(c.AllReduce({pa, kN}).ok());
    std::vector<float> sum = Download(ops, pa, kN);
    for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(sum[i], 10.0f + 2.0f * i);

    ASSERT_TRUE(c.AllGather({pa, kN}, {pb, kN * kRanks}).ok());
    std::vector<float> gathered = Download(ops, pb, kN * kRanks);
    for (int64_t i = 0; i < kN * kRanks; ++i) EXPECT_EQ(gathered[i], sum[i % kN]);

    ASSERT_TRUE(c.ReduceScatter({pb, kN * kRanks}, {pa, kN}).ok());
    std::vector<float> scattered = Download(ops, pa, kN);
    for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(scattered[i], 2.0f * sum[i]);

    ops.Fill(pa, kN, static_cast<float>(rank + 1));
    ASSERT_TRUE(c.Broadcast({pa, kN}, 1).ok());
    EXPECT_EQ(Download(ops, pa, kN), std::vector<float>(kN, 2.0f));

    auto work = c.AllReduceAsync({pa, kN}, comm::ReduceOp::kMax);
    ASSERT_TRUE(work->Wait().ok());
    EXPECT_EQ(Download(ops, pa, kN), std::vector<float>(kN, 2.0f));

    const int peer = 1 - rank;
    ops.Fill(pa, kN, static_cast<float>(rank + 5));
    auto send = c.SendAsync({pa, kN}, peer, 7);
    auto recv = c.RecvAsync({pb, kN}, peer, 7);
    ASSERT_TRUE(send->Wait().ok());
    ASSERT_TRUE(recv->Wait().ok());
    EXPECT_EQ(Download(ops, pb, kN), std::vector<float>(kN, static_cast<float>(peer + 5)));

    ASSERT_TRUE(c.Barrier().ok());
    EXPECT_EQ(c.Stats().at("all_reduce").calls, 2);
    EXPECT_EQ(static_cast<DeviceEmulationCommunicator&>(c).forwarded(), 7);
  });
}

// A single-rank group needs no peers, so the aborting check runs in a death
// test's child without deadlocking the other ranks.
class FakeComm final : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  absl::Status AllReduce(std::span<float>, comm::ReduceOp) override { return absl::OkStatus(); }
  std::unique_ptr<comm::Work> AllReduceAsync(std::span<float>, comm::ReduceOp) override {
    return std::make_unique<comm::DoneWork>(absl::OkStatus());
  }
  absl::Status ReduceScatter(std::span<const float>, std::span<float>) override {
    return absl::OkStatus();
  }
  absl::Status AllGather(std::span<const float>, std::span<float>) override {
    return absl::OkStatus();
  }
  absl::Status Broadcast(std::span<float>, int) override { return absl::OkStatus(); }
  absl::Status Send(std::span<const float>, int, uint32_t) override { return absl::OkStatus(); }
  absl::Status Recv(std::span<float>, int, uint32_t) override { return absl::OkStatus(); }
  absl::Status AllToAll(std::span<const float>, const std::vector<int64_t>&, std::span<float>,
                        const std::vector<int64_t>&) override {
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  comm::CommStats Stats() const override { return {}; }

 private:
  std::string name_ = "dp";
};

TEST(DeviceEmulationCommunicatorDeathTest, HostMemoryAbortsNamingTheOperation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceEmulationOps ops(kernels::cpu::MakeCpuOps());
  FakeComm fake;
  DeviceEmulationCommunicator c(&fake, &ops);
  std::vector<float> host(4);
  kernels::Buffer device = ops.Allocate(4 * sizeof(float));
  auto* p = static_cast<float*>(device.data());
  EXPECT_TRUE(c.AllReduce({p, 4}).ok());
  EXPECT_DEATH((void)c.AllReduce({host.data(), 4}),
               "DeviceEmulationCommunicator\\(dp\\)::AllReduce: argument data .* host memory");
  EXPECT_DEATH((void)c.AllGather({p, 4}, {host.data(), 4}), "AllGather: argument out");
  EXPECT_DEATH((void)c.Send({p, 5}, 0, 0), "Send: argument data .* inside one live allocation");
  EXPECT_DEATH((void)c.RecvAsync({p + 1, 4}, 0, 0), "RecvAsync: argument data");
}

}  // namespace
}  // namespace loom::engine::testing
