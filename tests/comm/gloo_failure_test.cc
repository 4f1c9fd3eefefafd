// Failures: a peer that never comes, a peer that dies mid-collective, an
// abort from a watchdog thread. Each must end in an error naming the group and
// the operation, promptly, never a hang. The time bounds below are loose on
// purpose: they tell "returned after the timeout" from "hung".
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/comm/file_store.h"
#include "tests/comm/rank_harness.h"
#include "tests/common/scratch_dir.h"

namespace loom::comm {
namespace {

using testing::MakeGroup;
using testing::UniquePrefix;

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

struct OpCase {
  std::string op;
  // Called on ranks 1 and 2 of three; rank 0 never takes part.
  std::function<absl::Status(int rank, Communicator&)> call;
  std::string op_on_rank2 = op;  // what rank 2 calls, when it differs
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.op; }

class TimeoutTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(TimeoutTest, AMissingRankTurnsIntoAnErrorNamingGroupAndOp) {
  InProcessStore store;
  auto comms = MakeGroup(store, 3, absl::Seconds(1), "dp");
  std::vector<absl::Status> results(3);
  std::vector<double> seconds(3);
  std::vector<std::thread> threads;
  for (int r = 1; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const auto start = std::chrono::steady_clock::now();
      results[r] = GetParam().call(r, *comms[r]);
      seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (auto& t : threads) t.join();
  bool someone_timed_out = false;
  for (int r = 1; r < 3; ++r) {
    const absl::Status& s = results[r];
    ASSERT_FALSE(s.ok()) << "rank " << r;
    EXPECT_TRUE(absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) << s;
    EXPECT_TRUE(Contains(s, "group dp: " + (r == 1 ? GetParam().op : GetParam().op_on_rank2))) << s;
    EXPECT_LT(seconds[r], 10.0) << s;
    if (absl::IsDeadlineExceeded(s) && Contains(s, "timed out after 1s waiting for peers")) someone_timed_out = true;
    // The group is broken now; later calls say so instead of hanging.
    std::vector<float> x(4);
    absl::Status later = comms[r]->AllReduce(x);
    EXPECT_FALSE(later.ok());
    EXPECT_TRUE(Contains(later, "group dp: all_reduce not run")) << later;
  }
  EXPECT_TRUE(someone_timed_out) << results[1] << " / " << results[2];
}

std::vector<OpCase> OpCases() {
  return {
      {"all_reduce", [](int, Communicator& c) { std::vector<float> x(64); return c.AllReduce(x); }},
      {"reduce_scatter",
       [](int, Communicator& c) { std::vector<float> in(30), out(10); return c.ReduceScatter(in, out); }},
      {"all_gather", [](int, Communicator& c) { std::vector<float> in(8), out(24); return c.AllGather(in, out); }},
      {"broadcast", [](int, Communicator& c) { std::vector<float> x(64); return c.Broadcast(x, 0); }},
      {"all_to_all",
       [](int, Communicator& c) {
         std::vector<int64_t> counts = {2, 2, 2};
         std::vector<float> in(6), out(6);
         return c.AllToAll(in, counts, out, counts);
       }},
      {"all_to_all_int64",
       [](int, Communicator& c) {
         std::vector<int64_t> in(6), out(6);
         return c.AllToAllInt64(in, out);
       }},
      {"barrier", [](int, Communicator& c) { return c.Barrier(); }},
      // Rank 1 sends to the absent rank 0, rank 2 waits to hear from it.
      {"send",
       [](int r, Communicator& c) {
         std::vector<float> x(16);
         return r == 1 ? c.Send(x, 0, 1) : c.Recv(x, 0, 1);
       },
       "recv"},
  };
}

INSTANTIATE_TEST_SUITE_P(EveryOp, TimeoutTest, ::testing::ValuesIn(OpCases()),
                         [](const auto& info) { return info.param.op; });

TEST(GlooAbortTest, AbortFromAnotherThreadEndsABlockedCollectivePromptly) {
  InProcessStore store;
  auto comms = MakeGroup(store, 2, absl::Seconds(60), "tp");
  absl::Status result;
  double seconds = 0;
  std::thread blocked([&] {
    std::vector<float> x(1000);
    const auto start = std::chrono::steady_clock::now();
    result = comms[0]->AllReduce(x);  // rank 1 never joins
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  // What a watchdog sees: the operation in flight.
  while (comms[0]->Progress().current_op.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(comms[0]->Progress().current_op, "all_reduce");
  EXPECT_EQ(comms[0]->Progress().completed, 0);
  comms[0]->Abort("watchdog: all_reduce stuck");
  blocked.join();
  EXPECT_TRUE(absl::IsAborted(result)) << result;
  EXPECT_TRUE(Contains(result, "group tp: all_reduce aborted: watchdog: all_reduce stuck")) << result;
  EXPECT_LT(seconds, 30.0);  // far below the 60 s timeout
  std::vector<float> y(4);
  absl::Status later = comms[0]->Broadcast(y, 0);
  EXPECT_TRUE(absl::IsAborted(later)) << later;
  // The peer learns at once too: its connections were closed.
  absl::Status peer = comms[1]->AllReduce(y);
  EXPECT_FALSE(peer.ok());
  EXPECT_TRUE(Contains(peer, "group tp: all_reduce")) << peer;
}

// The expert dispatcher's two exchanges stop on Abort like the others: the
// watchdog's way out when a peer never joins the all-to-all.
TEST(GlooAbortTest, AbortEndsBlockedAllToAlls) {
  for (const std::string op : {"all_to_all", "all_to_all_int64"}) {
    InProcessStore store;
    auto comms = MakeGroup(store, 2, absl::Seconds(60), "ep");
    absl::Status result;
    std::thread blocked([&] {
      if (op == "all_to_all") {
        std::vector<int64_t> counts = {3, 3};
        std::vector<float> in(6), out(6);
        result = comms[0]->AllToAll(in, counts, out, counts);  // rank 1 never joins
      } else {
        std::vector<int64_t> in(4), out(4);
        result = comms[0]->AllToAllInt64(in, out);
      }
    });
    while (comms[0]->Progress().current_op.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(comms[0]->Progress().current_op, op);
    comms[0]->Abort("watchdog: stuck");
    blocked.join();
    EXPECT_TRUE(absl::IsAborted(result)) << result;
    EXPECT_TRUE(Contains(result, "group ep: " + op + " aborted")) << result;
  }
}

TEST(GlooRendezvousTest, AMemberThatNeverJoinsIsNamed) {
  InProcessStore store;
  GlooOptions options;
  options.group_name = "pp";
  options.rank = 0;
  options.size = 2;
  options.key_prefix = UniquePrefix("lonely");
  options.timeout = absl::Seconds(1);
  auto comm = CreateGlooCommunicator(store, options);
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
  EXPECT_TRUE(Contains(comm.status(), "group pp: rendezvous timed out after 1s: rank 1 of 2")) << comm.status();
}

TEST(GlooRendezvousTest, BindsByInterfaceName) {
  InProcessStore store;
  const std::string prefix = UniquePrefix("iface");
  std::vector<std::unique_ptr<Communicator>> comms(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions options;
      options.group_name = "lo";
      options.rank = r;
      options.size = 2;
      options.key_prefix = prefix;
      options.timeout = absl::Seconds(20);
      options.interface = "lo";
      auto comm = CreateGlooCommunicator(store, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> x = {1.0f + r};
      ASSERT_TRUE((*comm)->AllReduce(x).ok());
      EXPECT_EQ(x[0], 3.0f);
      comms[r] = std::move(*comm);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(GlooRendezvousTest, BadOptionsAreRejected) {
  InProcessStore store;
  GlooOptions options;
  options.group_name = "dp";
  options.size = 2;
  options.rank = 2;
  options.key_prefix = "x";
  EXPECT_EQ(CreateGlooCommunicator(store, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.rank = 0;
  options.key_prefix = "";
  EXPECT_EQ(CreateGlooCommunicator(store, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.key_prefix = "x";
  options.hostname = "no-such-host.invalid";
  auto bad_host = CreateGlooCommunicator(store, options);
  EXPECT_EQ(bad_host.status().code(), absl::StatusCode::kInvalidArgument) << bad_host.status();
  EXPECT_TRUE(Contains(bad_host.status(), "'no-such-host.invalid'")) << bad_host.status();
  options.interface = "nosuchif0";
  auto bad_interface = CreateGlooCommunicator(store, options);
  EXPECT_EQ(bad_interface.status().code(), absl::StatusCode::kInvalidArgument) << bad_interface.status();
}

// --- A real process killed mid-collective ---------------------------------

constexpr int kProcs = 3;
constexpr int kVictim = 2;

// Runs in a forked child: all-reduces in a loop until an error. Exit 0 when
// the error names the group and op and came within the timeout (plus slack)
// of the last success; the message goes to the store for the parent.
[[noreturn]] void Survivor(const std::string& dir, int rank) {
  testing::FileStore store(dir);
  GlooOptions options;
  options.group_name = "dp";
  options.rank = rank;
  options.size = kProcs;
  options.key_prefix = "kill";
  options.timeout = absl::Seconds(2);
  options.rendezvous_timeout = absl::Seconds(20);
  auto comm = CreateGlooCommunicator(store, options);
  if (!comm.ok()) {
    store.Set(absl::StrCat("result", rank), comm.status().ToString()).IgnoreError();
    _exit(3);
  }
  std::vector<float> x(1 << 16);
  auto last_ok = std::chrono::steady_clock::now();
  for (int iter = 0; iter < 200000; ++iter) {
    std::fill(x.begin(), x.end(), 1.0f);
    absl::Status s = (*comm)->AllReduce(x);
    if (!s.ok()) {
      const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_ok).count();
      store.Set(absl::StrCat("result", rank), s.ToString()).IgnoreError();
      const bool named = s.message().find("group dp: all_reduce") != absl::string_view::npos;
      std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      _exit(named && since < 2.0 + 8.0 ? 0 : 4);
    }
    if (x[0] != kProcs) _exit(5);
    last_ok = std::chrono::steady_clock::now();
    if (rank == kVictim && iter == 20) store.Set("victim_running", "1").IgnoreError();
  }
  _exit(2);  // never saw an error
}

TEST(GlooKillTest, SurvivorsOfASigkilledPeerFailWithinTheTimeout) {
  const loom::testing::ScratchDir scratch("loom_comm_kill");
  ASSERT_FALSE(scratch.path().empty());
  const std::string& dir = scratch.path();
  std::vector<pid_t> pids;
  for (int r = 0; r < kProcs; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) Survivor(dir, r);
    pids.push_back(pid);
  }
  testing::FileStore store(dir);
  const bool victim_running = store.Get("victim_running", absl::Seconds(30)).ok();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  kill(pids[kVictim], SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pids[kVictim], &status, 0), pids[kVictim]);

  // Reap the survivors by pid, with a bound; kill what overstays it.
  std::vector<int> exits(kProcs, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int r = 0; r < kProcs; ++r) {
    if (r == kVictim) continue;
    for (;;) {
      const pid_t done = waitpid(pids[r], &status, WNOHANG);
      if (done == pids[r]) {
        exits[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ASSERT_TRUE(victim_running);
  for (int r = 0; r < kProcs; ++r) {
    if (r == kVictim) continue;
    auto message = store.Get(absl::StrCat("result", r), absl::ZeroDuration());
    EXPECT_EQ(exits[r], 0) << "rank " << r << ": " << (message.ok() ? *message : "no result (hung?)");
  }
}

}  // namespace
}  // namespace loom::comm
