// The bounded pool (coordinator/service/work_pool.h) that runs PlanJob
// searches and token writes off the callback threads: it takes work while a
// thread or a queue slot is free and refuses the rest at once.
#include "coordinator/service/work_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#include "absl/time/clock.h"

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

TEST(WorkPool, TakesWhatItHoldsAndRefusesTheRest) {
  absl::Notification started, release;
  std::atomic<int> done{0};
  {
    WorkPool pool(/*threads=*/1, /*max_queued=*/1);
    EXPECT_EQ(pool.capacity(), 2u);
    ASSERT_TRUE(pool.TrySubmit([&] {
      started.Notify();
      release.WaitForNotification();
      ++done;
    }));
    started.WaitForNotification();                    // the thread is busy
    EXPECT_TRUE(pool.TrySubmit([&] { ++done; }));     // one waits
    EXPECT_FALSE(pool.TrySubmit([&] { ++done; }));    // full: refused at once
    release.Notify();
  }  // the pool runs what it took before it goes
  EXPECT_EQ(done.load(), 2);
}

// One key (a caller) holds at most max_per_key calls, queued or running;
// others still get in, and the key's slot comes back when its call ends.
TEST(WorkPool, BoundsEachKeysCallsAndRunsAtALowerPriority) {
  absl::Notification started, release;
  std::atomic<int> done{0};
  std::atomic<int> nice{-100};
  {
    WorkPool pool(/*threads=*/2, /*max_queued=*/8, {.max_per_key = 1, .nice = 5});
    ASSERT_TRUE(pool.TrySubmit(
        [&] {
          nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
          started.Notify();
          release.WaitForNotification();
          ++done;
        },
        "mallory"));
    started.WaitForNotification();
    EXPECT_FALSE(pool.TrySubmit([&] { ++done; }, "mallory"));  // her one slot is taken
    EXPECT_TRUE(pool.TrySubmit([&] { ++done; }, "alice"));     // others still get in
    release.Notify();
    // Hers again once her call has ended (bounded wait, 10 s).
    bool again = false;
    for (int i = 0; i < 10000 && !again; ++i) {
      again = pool.TrySubmit([&] { ++done; }, "mallory");
      if (!again) absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_TRUE(again);
  }
  EXPECT_EQ(done.load(), 3);
  EXPECT_GE(nice.load(), 5);  // the pool's threads yield the CPU to the others
}

}  // namespace
}  // namespace loom::coordinator
