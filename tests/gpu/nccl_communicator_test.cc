// The NCCL Communicator (worker/comm/nccl_communicator.h). Without a CUDA
// device only the argument and no-device errors are checked and the rest is
// skipped with the reason. With one GPU: a group of one (every operation,
// counters, progress), the rendezvous timeout, and Abort. With two or more:
// ranks as threads, one device each, against values computed here, plus a
// peer that never joins a collective (the watchdog's timeout) and an exchange
// whose sends and receives are posted before either is waited on. With one
// GPU, too: a collective's time is the device's, not the host's wait, which
// also holds the kernels queued before it (the straggler detector's input).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "worker/comm/in_process_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/timed_communicator.h"

namespace loom::comm {
namespace {

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// A device buffer holding `host`; copies back with Host().
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(n_, 1) * sizeof(float)), cudaSuccess);
    if (n_ > 0) cudaMemcpy(ptr_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice);
  }
  ~DeviceFloats() { cudaFree(ptr_); }
  std::span<float> span() { return {ptr_, n_}; }
  std::vector<float> Host() const {
    std::vector<float> out(n_);
    if (n_ > 0) cudaMemcpy(out.data(), ptr_, n_ * sizeof(float), cudaMemcpyDeviceToHost);
    return out;
  }

 private:
  float* ptr_ = nullptr;
  size_t n_;
};

// The same for integers (the integer all-to-all's buffers).
class DeviceInts {
 public:
  explicit DeviceInts(const std::vector<int64_t>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(n_, 1) * sizeof(int64_t)), cudaSuccess);
    if (n_ > 0) cudaMemcpy(ptr_, host.data(), n_ * sizeof(int64_t), cudaMemcpyHostToDevice);
  }
  ~DeviceInts() { cudaFree(ptr_); }
  std::span<int64_t> span() { return {ptr_, n_}; }
  std::vector<int64_t> Host() const {
    std::vector<int64_t> out(n_);
    if (n_ > 0) cudaMemcpy(out.data(), ptr_, n_ * sizeof(int64_t), cudaMemcpyDeviceToHost);
    return out;
  }

 private:
  int64_t* ptr_ = nullptr;
  size_t n_;
};

NcclOptions Options(int rank, int size, absl::Duration timeout = absl::Seconds(30)) {
  NcclOptions o;
  o.group_name = "test";
  o.rank = rank;
  o.size = size;
  o.key_prefix = "job/attempt1/test";
  o.timeout = timeout;
  o.device = rank;
  return o;
}

TEST(NcclCommunicator, RejectsBadOptions) {
  InProcessStore store;
  absl::StatusOr<std::unique_ptr<Communicator>> c = CreateNcclCommunicator(store, Options(2, 2));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("group test"), std::string::npos) << c.status();
}

TEST(NcclCommunicator, ReportsMissingDevice) {
  if (CudaDeviceAvailable()) GTEST_SKIP() << "a CUDA device is present (this checks its absence)";
  InProcessStore store;
  absl::StatusOr<std::unique_ptr<Communicator>> c = CreateNcclCommunicator(store, Options(0, 1));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
}

TEST(NcclCommunicator, GroupOfOneRunsEveryOperation) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  InProcessStore store;
  auto c = CreateNcclCommunicator(store, Options(0, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  Communicator& comm = **c;
  DeviceFloats a({1, -2, 3});
  ASSERT_TRUE(comm.AllReduce(a.span()).ok());
  EXPECT_EQ(a.Host(), (std::vector<float>{1, -2, 3}));
  ASSERT_TRUE(comm.AllReduce(a.span(), ReduceOp::kMax).ok());
  DeviceFloats out({0, 0, 0});
  ASSERT_TRUE(comm.AllGather(a.span(), out.span()).ok());
  EXPECT_EQ(out.Host(), (std::vector<float>{1, -2, 3}));
  ASSERT_TRUE(comm.ReduceScatter(a.span(), out.span()).ok());
  ASSERT_TRUE(comm.Broadcast(a.span(), 0).ok());
  ASSERT_TRUE(comm.Barrier().ok());
  std::unique_ptr<Work> w = comm.AllReduceAsync(a.span());
  ASSERT_TRUE(w->Wait().ok());
  ASSERT_TRUE(w->Wait().ok());  // again: same answer
  EXPECT_EQ(comm.ReduceScatter(a.span(), DeviceFloats({0, 0}).span()).code(),
            absl::StatusCode::kInvalidArgument);
  // Integers arrive exactly (a float would round 2^60 + 1).
  DeviceInts ints({(int64_t{1} << 60) + 1, -7}), ints_out({0, 0});
  ASSERT_TRUE(comm.AllToAllInt64(ints.span(), ints_out.span()).ok());
  EXPECT_EQ(ints_out.Host(), (std::vector<int64_t>{(int64_t{1} << 60) + 1, -7}));
  EXPECT_EQ(comm.Stats()["all_to_all_int64"].calls, 1);
  EXPECT_EQ(comm.Stats()["all_reduce"].calls, 3);
  EXPECT_EQ(comm.Stats()["all_reduce"].logical_bytes, 36);
  const CommProgress p = comm.Progress();
  EXPECT_EQ(p.issued, p.completed);
  EXPECT_TRUE(p.current_op.empty());
}

// The compute stream is held for 300 ms by a host function before the
// collective (as a slow rank's kernels would hold it): the host waits that
// long, the collective itself runs in well under it on the device, and the
// collective clock records the device's time.
TEST(NcclCommunicator, ACollectiveIsTimedOnTheDeviceNotByTheHostsWait) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreate(&compute), cudaSuccess);
  InProcessStore store;
  NcclOptions options = Options(0, 1);
  options.compute_stream = compute;
  auto made = CreateNcclCommunicator(store, options);
  ASSERT_TRUE(made.ok()) << made.status();
  auto clock = std::make_shared<CollectiveClock>();
  TimedCommunicator comm(std::move(*made), clock);
  DeviceFloats a({1, 2, 3});
  clock->BeginStep(absl::Now());
  ASSERT_EQ(cudaLaunchHostFunc(
                compute,
                [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
                nullptr),
            cudaSuccess);
  const absl::Time before = absl::Now();
  ASSERT_TRUE(comm.AllReduce(a.span()).ok());
  const absl::Duration host = absl::Now() - before;
  const std::optional<absl::Duration> device = comm.LastDeviceTime();
  ASSERT_TRUE(device.has_value());
  EXPECT_GE(host, absl::Milliseconds(250));
  EXPECT_LT(*device, host / 2) << "the device time held the queued host function";
  const StepCollectives s = clock->Summary();
  EXPECT_EQ(s.blocked, *device);
  // An asynchronous call the same way.
  ASSERT_EQ(cudaLaunchHostFunc(
                compute,
                [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
                nullptr),
            cudaSuccess);
  std::unique_ptr<Work> w = comm.AllReduceAsync(a.span());
  ASSERT_TRUE(w->Wait().ok());
  const StepCollectives t = clock->Summary();
  EXPECT_LT(t.blocked, absl::Milliseconds(250));
  cudaStreamSynchronize(compute);
  cudaStreamDestroy(compute);
}

TEST(NcclCommunicator, RendezvousTimesOutWhenRankZeroNeverComes) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  InProcessStore store;
  NcclOptions o = Options(1, 2, absl::Milliseconds(300));
  o.device = 0;
  auto c = CreateNcclCommunicator(store, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("nccl_unique_id"), std::string::npos) << c.status();
}

TEST(NcclCommunicator, AbortFailsLaterCalls) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  InProcessStore store;
  auto c = CreateNcclCommunicator(store, Options(0, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  (*c)->Abort("test says stop");
  (*c)->Abort("twice is fine");
  DeviceFloats a({1});
  const absl::Status s = (*c)->AllReduce(a.span());
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("test says stop"), std::string::npos) << s;
}

// Runs fn(rank, comm) on `size` threads, one device each.
void RunRanks(int size, absl::Duration timeout,
              const std::function<void(int, Communicator&)>& fn) {
  InProcessStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      auto c = CreateNcclCommunicator(store, Options(r, size, timeout));
      ASSERT_TRUE(c.ok()) << c.status();
      fn(r, **c);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(NcclCommunicator, CollectivesAcrossDevices) {
  const int n = std::min(DeviceCount(), 4);
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices, found " << DeviceCount();
  RunRanks(n, absl::Seconds(60), [n](int r, Communicator& comm) {
    DeviceFloats x({float(r + 1), float(10 * r)});
    ASSERT_TRUE(comm.AllReduce(x.span()).ok());
    EXPECT_EQ(x.Host(), (std::vector<float>{n * (n + 1) / 2.0f, 10.0f * n * (n - 1) / 2}));
    DeviceFloats m({float(r)});
    ASSERT_TRUE(comm.AllReduce(m.span(), ReduceOp::kMax).ok());
    EXPECT_EQ(m.Host()[0], n - 1);
    std::vector<float> full(n);
    for (int i = 0; i < n; ++i) full[i] = float(i + r);
    DeviceFloats in(full), shard({0});
    ASSERT_TRUE(comm.ReduceScatter(in.span(), shard.span()).ok());
    EXPECT_EQ(shard.Host()[0], n * r + n * (n - 1) / 2.0f);
    DeviceFloats gathered(std::vector<float>(n, 0));
    ASSERT_TRUE(comm.AllGather(DeviceFloats({float(r)}).span(), gathered.span()).ok());
    for (int i = 0; i < n; ++i) EXPECT_EQ(gathered.Host()[i], i);
    DeviceFloats b({float(r)});
    ASSERT_TRUE(comm.Broadcast(b.span(), n - 1).ok());
    EXPECT_EQ(b.Host()[0], n - 1);
    // Ring exchange: both directions posted before waiting.
    DeviceFloats send({float(r)}), recv({-1});
    auto s = comm.SendAsync(send.span(), (r + 1) % n, 7);
    auto q = comm.RecvAsync(recv.span(), (r + n - 1) % n, 7);
    ASSERT_TRUE(q->Wait().ok());
    ASSERT_TRUE(s->Wait().ok());
    EXPECT_EQ(recv.Host()[0], (r + n - 1) % n);
    // Uneven all-to-all: rank r sends i + 1 copies of r to rank i.
    std::vector<int64_t> send_counts(n), recv_counts(n, r + 1);
    std::vector<float> payload;
    for (int i = 0; i < n; ++i) {
      send_counts[i] = i + 1;
      payload.insert(payload.end(), i + 1, float(r));
    }
    DeviceFloats a2a_in(payload), a2a_out(std::vector<float>(n * (r + 1), -1));
    ASSERT_TRUE(comm.AllToAll(a2a_in.span(), send_counts, a2a_out.span(), recv_counts).ok());
    const std::vector<float> got = a2a_out.Host();
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= r; ++j) EXPECT_EQ(got[i * (r + 1) + j], i);
    // Integer all-to-all, two per peer: (source << 40) + destination, and its negative.
    std::vector<int64_t> ints;
    for (int i = 0; i < n; ++i) ints.insert(ints.end(), {(int64_t{r} << 40) + i, -((int64_t{r} << 40) + i)});
    DeviceInts ints_in(ints), ints_out(std::vector<int64_t>(2 * n, 0));
    ASSERT_TRUE(comm.AllToAllInt64(ints_in.span(), ints_out.span()).ok());
    const std::vector<int64_t> got_ints = ints_out.Host();
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(got_ints[2 * i], (int64_t{i} << 40) + r);
      EXPECT_EQ(got_ints[2 * i + 1], -((int64_t{i} << 40) + r));
    }
    ASSERT_TRUE(comm.Barrier().ok());
  });
}

TEST(NcclCommunicator, WatchdogTimesOutAMissingPeer) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices, found " << DeviceCount();
  RunRanks(2, absl::Seconds(2), [](int r, Communicator& comm) {
    if (r == 1) return;  // never joins the collective (and destroys its side)
    DeviceFloats x({1});
    const auto start = std::chrono::steady_clock::now();
    const absl::Status s = comm.AllReduce(x.span());
    EXPECT_FALSE(s.ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
    EXPECT_NE(s.message().find("all_reduce"), std::string::npos) << s;
    EXPECT_FALSE(comm.Barrier().ok());  // broken for good
  });
}

}  // namespace
}  // namespace loom::comm
