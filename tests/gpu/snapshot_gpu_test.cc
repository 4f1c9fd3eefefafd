// In-place recovery on a GPU (docs/fault_tolerance.md), skipped with the
// reason where there is no CUDA device:
//  - a training loop on CudaOps captures its snapshot (device to host),
//    trains on, rolls back to it (host to device) and captures again: the two
//    images are byte-identical, and so is the capture of a fresh loop (its
//    random init skipped) restored from it; the steps trained again after the
//    rollback match the first pass (bit for bit where the kernels are
//    deterministic; the test prints which);
//  - an attempt's NCCL groups in a CommunicatorSet: the set's abort stops
//    them (ncclCommAbort), and with two devices a collective blocked on a
//    peer that never comes returns at once.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tests/engine/test_util.h"
#include "worker/comm/communicator_set.h"
#include "worker/engine/ops_selection.h"
#include "worker/engine/snapshot/snapshot.h"
#include "worker/engine/training_loop.h"
#if LOOM_SNAPSHOT_TEST_HAVE_NCCL
#include "worker/comm/in_process_store.h"
#include "worker/comm/nccl_communicator.h"
#endif

namespace loom::engine {
namespace {

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

bool SameImage(const Snapshot& a, const Snapshot& b) {
  return a.size_bytes() == b.size_bytes() &&
         std::memcmp(a.bytes().data(), b.bytes().data(), static_cast<size_t>(a.size_bytes())) == 0;
}

TEST(SnapshotGpuTest, RollsBackThroughTheDeviceAndCapturesTheSameImage) {
  if (DeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
  testing::ScratchDir dir;
  testing::WriteTinyCorpus(dir);
  spec::JobSpec job = testing::TinyJob(dir / "train.txt", dir / "val.txt");
  job.train.steps = 6;
  job.resources.device = spec::DeviceKind::kGpu;
  absl::StatusOr<std::shared_ptr<kernels::Ops>> ops = MakeOpsForJob(job, 0);
  if (!ops.ok()) GTEST_SKIP() << ops.status();
  ASSERT_NE((*ops)->device(), kernels::DeviceType::kCpu);
  auto loop = TrainingLoop::Create(job, 0, 1, nullptr, nullptr, nullptr, *ops);
  ASSERT_TRUE(loop.ok()) << loop.status();
  std::vector<double> first, again;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*loop)->TrainStep().ok());
  Snapshot taken;
  ASSERT_TRUE((*loop)->CaptureSnapshot(&taken).ok());
  for (int i = 0; i < 2; ++i) {
    auto p = (*loop)->TrainStep();
    ASSERT_TRUE(p.ok()) << p.status();
    first.push_back(p->loss);
  }
  ASSERT_TRUE((*loop)->RestoreSnapshot(taken).ok());
  EXPECT_EQ((*loop)->step(), 2);
  Snapshot restored;
  ASSERT_TRUE((*loop)->CaptureSnapshot(&restored).ok());
  EXPECT_TRUE(SameImage(taken, restored));
  for (int i = 0; i < 2; ++i) {
    auto p = (*loop)->TrainStep();
    ASSERT_TRUE(p.ok()) << p.status();
    again.push_back(p->loss);
  }
  bool bitwise = true;
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_NEAR(again[i], first[i], 1e-5 * std::abs(first[i])) << "step " << 3 + i;
    bitwise = bitwise && again[i] == first[i];
  }
  std::printf("steps trained again after the rollback: %s\n",
              bitwise ? "bit for bit" : "within 1e-5 (the kernels are not deterministic)");

  // A relaunched rank: a fresh loop, no init, the snapshot copied up.
  LoopOptions no_init;
  no_init.initialize_parameters = false;
  ParallelContext one;
  auto fresh = TrainingLoop::Create(job, one, *ops, no_init);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_TRUE((*fresh)->RestoreSnapshot(taken).ok());
  Snapshot again_taken;
  ASSERT_TRUE((*fresh)->CaptureSnapshot(&again_taken).ok());
  EXPECT_TRUE(SameImage(taken, again_taken));
}

#if LOOM_SNAPSHOT_TEST_HAVE_NCCL
comm::NcclOptions Options(int rank, int size, absl::Duration timeout) {
  comm::NcclOptions o;
  o.group_name = "dp";
  o.rank = rank;
  o.size = size;
  o.key_prefix = "job/attempt-1/dp";
  o.timeout = timeout;
  o.device = rank;
  return o;
}

TEST(SnapshotGpuTest, AnAttemptsNcclGroupsStopOnTheSetsAbort) {
  if (!comm::CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  comm::InProcessStore store;
  auto made = comm::CreateNcclCommunicator(store, Options(0, 1, absl::Seconds(30)));
  ASSERT_TRUE(made.ok()) << made.status();
  comm::CommunicatorSet set;
  comm::Communicator* dp = set.Add(std::move(*made));
  set.Abort("attempt 1 aborted by the coordinator");
  float* x = nullptr;
  ASSERT_EQ(cudaMalloc(&x, sizeof(float)), cudaSuccess);
  const absl::Status s = dp->AllReduce(std::span<float>(x, 1));
  cudaFree(x);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

TEST(SnapshotGpuTest, AnAbortEndsACollectiveBlockedOnAMissingPeer) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices, found " << DeviceCount();
  comm::InProcessStore store;
  std::vector<std::unique_ptr<comm::Communicator>> comms(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      auto c = comm::CreateNcclCommunicator(store, Options(r, 2, absl::Seconds(60)));
      ASSERT_TRUE(c.ok()) << c.status();
      comms[static_cast<size_t>(r)] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  comm::CommunicatorSet set;
  comm::Communicator* dp = set.Add(std::move(comms[0]));
  absl::Status result;
  double seconds = 0;
  std::thread blocked([&] {
    cudaSetDevice(0);
    float* x = nullptr;
    cudaMalloc(&x, sizeof(float));
    const auto start = std::chrono::steady_clock::now();
    result = dp->AllReduce(std::span<float>(x, 1));  // rank 1 never joins
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    cudaFree(x);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  set.Abort("attempt 1 aborted by the coordinator");
  blocked.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kAborted) << result;
  EXPECT_LT(seconds, 30.0);  // far below the 60 s timeout
  comms[1]->Abort("the peer's side goes too");
}
#endif

}  // namespace
}  // namespace loom::engine
