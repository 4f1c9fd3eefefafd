// The pieces without sockets: stores, the traffic formulas, the error
// wording, the ordered queue, and the communicator of a group of one.
#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/gloo_errors.h"
#include "worker/comm/in_process_store.h"
#include "worker/comm/op_queue.h"
#include "worker/comm/prefix_store.h"
#include "worker/comm/self_communicator.h"
#include "worker/comm/traffic.h"

namespace loom::comm {
namespace {

TEST(InProcessStoreTest, GetWaitsForASetFromAnotherThread) {
  InProcessStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(store.Set("k", "v").ok());
  });
  auto value = store.Get("k", absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

TEST(InProcessStoreTest, GetTimesOutNamingTheKey) {
  InProcessStore store;
  auto value = store.Get("missing", absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(value.status()));
  EXPECT_NE(value.status().message().find("'missing'"), std::string::npos);
}

TEST(InProcessStoreTest, AddIsAtomicAcrossThreads) {
  InProcessStore store;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 250; ++i) ASSERT_TRUE(store.Add("n", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*store.Add("n", 0), 1000);
  ASSERT_TRUE(store.Set("text", "abc").ok());
  EXPECT_EQ(store.Add("text", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrefixStoreTest, NamespacesKeys) {
  InProcessStore base;
  PrefixStore a(base, "job1/1/dp"), b(base, "job1/2/dp");
  ASSERT_TRUE(a.Set("0", "x").ok());
  ASSERT_TRUE(b.Set("0", "y").ok());
  EXPECT_EQ(*a.Get("0", absl::ZeroDuration()), "x");
  EXPECT_EQ(*b.Get("0", absl::ZeroDuration()), "y");
  EXPECT_EQ(*base.Get("job1/1/dp/0", absl::ZeroDuration()), "x");
  EXPECT_EQ(*a.Add("count", 2), 2);
  EXPECT_EQ(base.size(), 3u);
}

TEST(TrafficTest, RingVolumes) {
  EXPECT_EQ(traffic::AllReduceBytes(4000, 4), 6000);
  EXPECT_EQ(traffic::AllReduceBytes(4000, 1), 0);
  EXPECT_EQ(traffic::ReduceScatterBytes(4000, 4), 3000);
  EXPECT_EQ(traffic::AllGatherBytes(1000, 4), 3000);
  EXPECT_EQ(traffic::AllToAllBytes({1, 2, 3}, 1, 4), 16);
}

TEST(TrafficTest, BroadcastTreeSendsNMinusOneCopiesInAll) {
  for (int n = 1; n <= 9; ++n) {
    for (int root = 0; root < n; ++root) {
      int total = 0;
      for (int r = 0; r < n; ++r) total += traffic::BroadcastChildren(n, r, root);
      EXPECT_EQ(total, n - 1) << "n " << n << " root " << root;
      int log2ceil = 0;
      while ((1 << log2ceil) < n) ++log2ceil;
      EXPECT_EQ(traffic::BroadcastChildren(n, root, root), log2ceil);
    }
  }
  EXPECT_EQ(traffic::BroadcastBytes(100, 4, 1, 0), 100);
}

TEST(GlooErrorsTest, TimeoutsLostPeersAndMisuseReadDifferently) {
  absl::Status timeout = GlooFailureToStatus("dp", "all_reduce", GlooFailureKind::kIo,
                                             "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for "
                                             "recv operation to complete",
                                             absl::Seconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(timeout));
  EXPECT_EQ(std::string(timeout.message()).rfind("group dp: all_reduce timed out after 5s waiting for peers", 0), 0u)
      << timeout;
  EXPECT_EQ(std::string(timeout.message()).find("unbound_buffer.cc"), std::string::npos);

  absl::Status lost = GlooFailureToStatus("tp[0,1]", "send", GlooFailureKind::kIo,
                                          "[pair.cc:1] Connection closed by peer [127.0.0.1]:1234", absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(lost));
  EXPECT_EQ(std::string(lost.message()).rfind("group tp[0,1]: send failed: lost the connection", 0), 0u) << lost;

  absl::Status misuse = GlooFailureToStatus("dp", "all_gather", GlooFailureKind::kOther, "size mismatch",
                                            absl::Seconds(5));
  EXPECT_TRUE(absl::IsInternal(misuse));
}

TEST(OpQueueTest, RunsInSubmissionOrderOnOneThread) {
  OpQueue queue("g");
  std::vector<int> order;
  std::vector<std::shared_ptr<OpState>> states;
  for (int i = 0; i < 50; ++i) {
    states.push_back(queue.Submit("op", [&order, i] {
      order.push_back(i);
      return absl::OkStatus();
    }));
  }
  for (auto& s : states) ASSERT_TRUE(s->WaitUntil(absl::InfiniteFuture()));
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(queue.Progress().issued, 50);
  EXPECT_EQ(queue.Progress().completed, 50);
}

TEST(OpQueueTest, DestructionCancelsWhatHasNotStarted) {
  std::shared_ptr<OpState> later;
  std::atomic<bool> started{false}, release{false};
  std::thread releaser;
  {
    OpQueue queue("g");
    queue.Submit("slow", [&] {
      started = true;
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return absl::OkStatus();
    });
    later = queue.Submit("all_reduce", [] { return absl::OkStatus(); });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    releaser = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      release = true;
    });
  }  // the destructor cancels all_reduce, then waits for slow
  releaser.join();
  ASSERT_TRUE(later->done());
  EXPECT_TRUE(absl::IsCancelled(later->status())) << later->status();
}

TEST(OpQueueTest, QueuedWorkCallsTheOverrunHookOnce) {
  OpQueue queue("g");
  std::atomic<bool> release{false};
  std::atomic<int> overruns{0};
  auto state = queue.Submit("stuck", [&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return absl::DeadlineExceededError("stopped");
  });
  QueuedWork work(state, absl::Milliseconds(50), [&] {
    ++overruns;
    release = true;  // what an abort does: the stuck operation returns
  });
  EXPECT_TRUE(absl::IsDeadlineExceeded(work.Wait()));
  EXPECT_EQ(overruns, 1);
}

TEST(SelfCommunicatorTest, CopiesAndCounts) {
  SelfCommunicator comm("dp[3]");
  std::vector<float> x = {1, 2, 3}, y(3);
  ASSERT_TRUE(comm.AllReduce(x).ok());
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  ASSERT_TRUE(comm.AllReduceAsync(x)->Wait().ok());
  ASSERT_TRUE(comm.ReduceScatter(x, y).ok());
  EXPECT_EQ(y, x);
  ASSERT_TRUE(comm.AllGather(x, y).ok());
  ASSERT_TRUE(comm.AllToAll(x, {3}, y, {3}).ok());
  std::vector<int64_t> ints = {int64_t{1} << 60, -3}, ints_out(2);
  ASSERT_TRUE(comm.AllToAllInt64(ints, ints_out).ok());
  EXPECT_EQ(ints_out, ints);
  ASSERT_TRUE(comm.Broadcast(x, 0).ok());
  ASSERT_TRUE(comm.Barrier().ok());
  EXPECT_EQ(comm.Send(x, 0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.SendAsync(x, 1, 0)->Wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.ReduceScatter(x, std::span<float>(y).first(1)).code(), absl::StatusCode::kInvalidArgument);
  const CommStats stats = comm.Stats();
  EXPECT_EQ(stats.at("all_reduce").calls, 2);
  EXPECT_EQ(stats.at("all_reduce").bytes, 0);
  EXPECT_EQ(stats.at("all_reduce").logical_bytes, 24);
  EXPECT_EQ(stats.at("all_to_all_int64").logical_bytes, 16);
  comm.Abort("test");
  EXPECT_TRUE(absl::IsAborted(comm.AllReduce(x)));
}

}  // namespace
}  // namespace loom::comm
