// Context parallelism's ring transfers overlap its blocks on NCCL's launch
// rule. The emulated communicator holds posted sends and receives until they
// are started, the first wait, or the next collective, as the NCCL
// communicator does; each rank's trace interleaves the batches' starts and
// waits with the attention ops of the ring's blocks. A hop that overlaps has
// attention ops between its start and its wait; one started only at its wait
// (what NCCL did before RingAttention started its posts) has none.
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/engine_device/device_emulation_communicator.h"
#include "tests/engine_device/device_emulation_ops.h"
#include "tests/engine_device/op_trace.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/context_parallel/ring_attention.h"
#include "worker/engine/context_parallel/zigzag.h"

namespace loom::engine {
namespace {

using testing::DeviceEmulationCommunicator;
using testing::DeviceEmulationOps;
using testing::OpTrace;

// Per batch of posts, in the order they started: the attention ops the rank
// issued between the batch's start and its first wait (-1: never waited for).
std::vector<int> OpsInFlight(const std::vector<std::string>& events) {
  std::map<int, size_t> index;  // batch number -> position in the result
  std::vector<int> ops_at_start, in_flight;
  int ops = 0;
  for (const std::string& e : events) {
    if (e.rfind("start ", 0) == 0) {
      index[std::atoi(e.c_str() + 6)] = in_flight.size();
      ops_at_start.push_back(ops);
      in_flight.push_back(-1);
    } else if (e.rfind("wait ", 0) == 0) {
      auto it = index.find(std::atoi(e.c_str() + 5));
      if (it != index.end()) in_flight[it->second] = ops - ops_at_start[it->second];
    } else {
      ++ops;
    }
  }
  return in_flight;
}

struct RankTrace {
  std::vector<std::string> forward, backward;
};

std::vector<RankTrace> RunRing(int cp) {
  RingDims d;
  d.batch = 2;
  d.heads = 4;
  d.kv_heads = 2;
  d.head_dim = 8;
  d.scale = 0.35f;
  auto z = ZigzagSplit::Make(4 * cp, cp);
  EXPECT_TRUE(z.ok());
  const int64_t rows = d.batch * z->local_seq();
  const int64_t stride = d.q_width() + 2 * d.kv_width();
  std::vector<std::unique_ptr<DeviceEmulationOps>> ops;
  for (int r = 0; r < cp; ++r) {
    ops.push_back(std::make_unique<DeviceEmulationOps>(kernels::cpu::MakeCpuOps(1)));
  }
  comm::InProcessStore store;
  std::vector<const DeviceEmulationOps*> members;
  for (auto& o : ops) members.push_back(o.get());
  std::vector<std::unique_ptr<comm::Communicator>> group = testing::WrapGroup(
      comm::testing::MakeGroup(store, cp, absl::Seconds(60), "cp_overlap"), members);
  std::vector<RankTrace> traces(cp);
  std::vector<std::thread> threads;
  for (int r = 0; r < cp; ++r) {
    threads.emplace_back([&, r] {
      kernels::Ops& o = *ops[r];
      std::mt19937 rng(7 + r);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> host(static_cast<size_t>(rows * stride));
      for (float& x : host) x = normal(rng);
      kernels::Buffer qkv = o.AllocateFloats(rows * stride);
      kernels::Buffer dqkv = o.AllocateFloats(rows * stride);
      kernels::Buffer out = o.AllocateFloats(rows * d.q_width());
      kernels::Buffer d_out = o.AllocateFloats(rows * d.q_width());
      kernels::Buffer lse = o.AllocateFloats(RingLseFloats(d, *z));
      o.CopyHostToDevice(qkv.data(), host.data(), rows * stride * 4);
      o.CopyHostToDevice(d_out.data(), host.data(), rows * d.q_width() * 4);
      RingAttention ring(o, *group[r]);
      auto* comm = static_cast<DeviceEmulationCommunicator*>(group[r].get());
      OpTrace forward, backward;
      ops[r]->set_trace(&forward);
      comm->set_trace(&forward);
      ASSERT_TRUE(ring.Forward(d, *z, qkv.f32(), stride, out.f32(), lse.f32()).ok());
      ops[r]->set_trace(&backward);
      comm->set_trace(&backward);
      ASSERT_TRUE(ring.Backward(d, *z, qkv.f32(), stride, out.f32(), lse.f32(), d_out.f32(),
                                dqkv.f32())
                      .ok());
      ops[r]->set_trace(nullptr);
      comm->set_trace(nullptr);
      traces[r] = {forward.events(), backward.events()};
    });
  }
  for (auto& t : threads) t.join();
  return traces;
}

TEST(CpOverlapDevice, EveryRingHopIsInFlightWhileItsStepsBlocksCompute) {
  const int cp = 3;
  const std::vector<RankTrace> traces = RunRing(cp);
  for (int r = 0; r < cp; ++r) {
    // Forward: cp - 1 K/V hops, each over one step's blocks.
    const std::vector<int> forward = OpsInFlight(traces[r].forward);
    ASSERT_EQ(forward.size(), static_cast<size_t>(cp - 1)) << "rank " << r;
    for (size_t b = 0; b < forward.size(); ++b) {
      EXPECT_GT(forward[b], 0) << "rank " << r << ": forward K/V hop " << b
                               << " did not overlap its step's blocks";
    }
    // Backward: cp - 1 K/V hops and cp dK/dV hops, posted in step order (K/V
    // of step s, then dK/dV of step s). Every hop overlaps a step's blocks
    // except the last dK/dV hop, which takes the accumulators home after the
    // last block (nothing is left to compute).
    const std::vector<int> backward = OpsInFlight(traces[r].backward);
    ASSERT_EQ(backward.size(), static_cast<size_t>(2 * cp - 1)) << "rank " << r;
    for (size_t b = 0; b + 1 < backward.size(); ++b) {
      EXPECT_GT(backward[b], 0) << "rank " << r << ": backward hop " << b
                                << " did not overlap a step's blocks";
    }
    EXPECT_EQ(backward.back(), 0) << "rank " << r << ": the last dK/dV hop";
  }
}

}  // namespace
}  // namespace loom::engine
