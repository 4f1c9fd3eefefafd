// loom-loadgen's job clock: the simulated job's steps as a function of time,
// started by the last rank to resume, frozen by a failure, and the
// milestones of each attempt a recovery is measured by.
#include "tools/loadgen/job_clock.h"

#include "gtest/gtest.h"

namespace loom::loadgen {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

absl::Time At(double seconds) { return kT0 + absl::Seconds(seconds); }

TEST(JobClock, NoStepUntilEveryRankResumed) {
  JobClock clock(absl::Seconds(1));
  clock.BeginAttempt(1, 0, 3, At(0));
  clock.Resumed(1, 0, At(0.1));
  clock.Resumed(1, 1, At(0.2));
  clock.Resumed(1, 1, At(0.3));  // a repeat counts once
  JobClock::View v = clock.At(At(5));
  EXPECT_EQ(v.attempt, 1);
  EXPECT_EQ(v.resumed, 2);
  EXPECT_FALSE(v.stepping);
  EXPECT_EQ(v.step, 0);
  clock.Resumed(1, 2, At(10));
  v = clock.At(At(10.5));
  EXPECT_TRUE(v.stepping);
  EXPECT_EQ(v.step, 0);
  EXPECT_EQ(v.all_resumed, At(10));
  EXPECT_EQ(clock.At(At(11)).step, 1);
  EXPECT_EQ(clock.At(At(13.9)).step, 3);
}

TEST(JobClock, AFailureFreezesItAndTheNextAttemptStartsAfterItsBase) {
  JobClock clock(absl::Seconds(2));
  clock.BeginAttempt(1, 0, 2, At(0));
  clock.Resumed(1, 0, At(0));
  clock.Resumed(1, 1, At(0));
  clock.Freeze(At(7));  // step 3 completed at 6
  JobClock::View v = clock.At(At(100));
  EXPECT_TRUE(v.frozen);
  EXPECT_FALSE(v.stepping);
  EXPECT_EQ(v.step, 3);
  EXPECT_EQ(v.frozen_since, At(7));

  clock.BeginAttempt(2, 3, 2, At(8));
  clock.BeginAttempt(1, 0, 2, At(9));  // an older attempt changes nothing
  v = clock.At(At(20));
  EXPECT_EQ(v.attempt, 2);
  EXPECT_FALSE(v.frozen);
  EXPECT_FALSE(v.stepping);
  EXPECT_EQ(v.step, 3);
  EXPECT_EQ(v.base_step, 3);
  clock.Resumed(1, 0, At(20));  // of the old attempt: not counted
  EXPECT_EQ(clock.At(At(20)).resumed, 0);
  clock.Resumed(2, 0, At(21));
  clock.Resumed(2, 1, At(22));
  EXPECT_EQ(clock.At(At(23.9)).step, 3);
  EXPECT_EQ(clock.At(At(24)).step, 4);
}

TEST(JobClock, EveryRankPastItsFirstStepIsAMilestone) {
  JobClock clock(absl::Seconds(1));
  clock.BeginAttempt(4, 9, 2, At(0));
  clock.PastFirstStep(4, 1, At(3));
  clock.PastFirstStep(3, 0, At(3.5));  // another attempt's
  clock.PastFirstStep(4, 1, At(4));    // a repeat
  EXPECT_EQ(clock.At(At(5)).past_first_step, 1);
  EXPECT_EQ(clock.At(At(5)).all_past_first_step, absl::InfiniteFuture());
  clock.PastFirstStep(4, 0, At(6));
  EXPECT_EQ(clock.At(At(7)).all_past_first_step, At(6));
  clock.PastFirstStep(4, 7, At(8));  // not a rank of the job
  EXPECT_EQ(clock.At(At(8)).past_first_step, 2);
}

}  // namespace
}  // namespace loom::loadgen
