// Stalls (worker/comm/stall_watch.h) and what the collective clock makes of
// them: a process stopped from outside (SIGSTOP, a real fault, in a forked
// child) is seen as a stall of about that length; a stall that falls while a
// collective blocked the rank is told apart from one that falls in its own
// work, so the time a stopped rank held its peers up counts as its own.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "worker/comm/collective_clock.h"
#include "worker/comm/stall_watch.h"

namespace loom::comm {
namespace {

TEST(CollectiveClockStallTest, AStallWhileBlockedIsToldApartFromOneInTheRanksOwnWork) {
  CollectiveClock clock;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const auto at = [&](int ms) { return t0 + absl::Milliseconds(ms); };
  clock.RecordStall(at(-50), at(-10));  // before any step: dropped
  clock.BeginStep(t0);
  clock.Record("dp[0,1]", "all_reduce", at(100), absl::Milliseconds(300));  // blocked 100-400
  clock.Record("dp[0,1]", "all_reduce", at(700), absl::Milliseconds(100));  // blocked 700-800
  clock.RecordStall(at(200), at(350));  // inside the first wait
  clock.RecordStall(at(450), at(550));  // in its own work
  clock.RecordStall(at(750), at(900));  // half in the second wait
  const StepCollectives s = clock.Summary(at(1000));
  EXPECT_EQ(s.blocked, absl::Milliseconds(400));
  EXPECT_EQ(s.stalled, absl::Milliseconds(400));
  EXPECT_EQ(s.stalled_while_blocked, absl::Milliseconds(200));
  // A new step starts with none.
  clock.BeginStep(at(1000));
  EXPECT_EQ(clock.Summary(at(1100)).stalled, absl::ZeroDuration());
}

TEST(CollectiveClockStallTest, OverlappingAsynchronousWaitsNeverCountAStallTwice) {
  CollectiveClock clock;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const auto at = [&](int ms) { return t0 + absl::Milliseconds(ms); };
  clock.BeginStep(t0);
  clock.Record("dp", "all_reduce", at(100), absl::Milliseconds(200));  // 100-300
  clock.Record("dp", "all_gather", at(150), absl::Milliseconds(100));  // 150-250, inside
  clock.RecordStall(at(120), at(280));
  const StepCollectives s = clock.Summary(at(400));
  EXPECT_EQ(s.stalled_while_blocked, absl::Milliseconds(160));
}

// A child runs a watch for 1.2 s and writes what it saw; the parent stops it
// for 300 ms in the middle.
TEST(StallWatchTest, AProcessStoppedFromOutsideSeesTheStop) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    std::atomic<int64_t> stalled_ms{0};
    {
      StallWatch watch([&](absl::Time from, absl::Time to) {
        stalled_ms += absl::ToInt64Milliseconds(to - from);
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    }
    const int64_t out = stalled_ms.load();
    _exit(write(fds[1], &out, sizeof(out)) == sizeof(out) ? 0 : 1);
  }
  close(fds[1]);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(kill(child, SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(kill(child, SIGCONT), 0);
  int64_t stalled_ms = -1;
  const ssize_t got = read(fds[0], &stalled_ms, sizeof(stalled_ms));
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof(stalled_ms)));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The stop, less the watch's own tick and threshold at most.
  EXPECT_GE(stalled_ms, 200) << "the 300 ms stop was not seen";
}

}  // namespace
}  // namespace loom::comm
