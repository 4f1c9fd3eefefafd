// What a step report says of a rank's time (worker/trainer/rank_reports.h):
// a stall that fell while the rank was blocked in a collective is its own
// time, not waiting (its peers waited for it); the rest of the wait stays
// waiting, and the stalls are reported whole.
#include "worker/trainer/rank_reports.h"

#include <gtest/gtest.h>

namespace loom::trainer {
namespace {

TEST(RankReportsTest, AStallWhileBlockedCountsAsTheRanksOwnTime) {
  comm::StepCollectives c;
  c.elapsed = absl::Milliseconds(1000);
  c.blocked = absl::Milliseconds(400);
  c.stalled = absl::Milliseconds(250);
  c.stalled_while_blocked = absl::Milliseconds(150);
  loom::v1::StepTiming t;
  SetTiming(c, &t);
  EXPECT_DOUBLE_EQ(t.wait_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(t.compute_seconds(), 0.75);
  EXPECT_DOUBLE_EQ(t.stalled_seconds(), 0.25);
  // Without stalls the wait is all of the time blocked.
  c.stalled = c.stalled_while_blocked = absl::ZeroDuration();
  SetTiming(c, &t);
  EXPECT_DOUBLE_EQ(t.wait_seconds(), 0.4);
  EXPECT_DOUBLE_EQ(t.compute_seconds(), 0.6);
}

}  // namespace
}  // namespace loom::trainer
