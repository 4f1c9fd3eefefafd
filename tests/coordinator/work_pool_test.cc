// The bounded pool (coordinator/service/work_pool.h) that runs PlanJob
// searches and token writes off the callback threads: it takes work while a
// thread or a queue slot is free and refuses the rest at once.
#include "coordinator/service/work_pool.h"

#include <atomic>

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

}  // namespace
}  // namespace loom::coordinator
