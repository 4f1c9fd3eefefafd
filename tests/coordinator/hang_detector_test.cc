// Hang detection and diagnosis on synthetic progress reports.
#include "coordinator/health/hang_detector.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);

loom::v1::RankProgress Report(int rank, int64_t step, int64_t dp_issued, int64_t dp_completed,
                              const std::string& phase = "running", const std::string& op = "") {
  loom::v1::RankProgress p;
  p.set_rank(rank);
  p.set_step(step);
  p.set_phase(phase);
  p.set_micro_batch(-1);
  auto* g = p.add_groups();
  g->set_group("dp[0,1]");
  g->set_issued(dp_issued);
  g->set_completed(dp_completed);
  g->set_current_op(op);
  return p;
}

loom::v1::RankProgress Step(int rank, int64_t step, double seconds) {
  loom::v1::RankProgress p = Report(rank, step, step, step, "step");
  p.set_step_seconds(seconds);
  return p;
}

HangDetector Detector(absl::Duration fixed = absl::ZeroDuration()) {
  HangPolicy policy;
  policy.fixed_timeout = fixed;
  policy.floor = absl::Seconds(10);
  policy.first_step_allowance = absl::Seconds(60);
  policy.checkpoint_allowance = absl::Seconds(30);
  return HangDetector(policy, {"TP(0)-CP(0)-PP(0)-DP(0)-Rank(0)", "TP(0)-CP(0)-PP(0)-DP(1)-Rank(1)"},
                      kStart);
}

TEST(HangDetector, FirstStepGetsItsAllowance) {
  HangDetector d = Detector();
  EXPECT_EQ(d.Timeout(), absl::Seconds(60));
  EXPECT_FALSE(d.Check(kStart + absl::Seconds(59)).has_value());
  EXPECT_TRUE(d.Check(kStart + absl::Seconds(61)).has_value());
}

TEST(HangDetector, AFixedTimeoutStillAllowsTheFirstStep) {
  HangDetector d = Detector(absl::Seconds(5));
  EXPECT_EQ(d.Timeout(), absl::Seconds(60));  // startup: the allowance
  EXPECT_FALSE(d.Check(kStart + absl::Seconds(59)).has_value());
  d.Observe(Step(0, 1, 0.5), kStart + absl::Seconds(10));
  EXPECT_EQ(d.Timeout(), absl::Seconds(5));  // after a step: the spec's
  EXPECT_TRUE(d.Check(kStart + absl::Seconds(16)).has_value());
}

TEST(HangDetector, CalibratesFromTheSlowestStepWithAFloor) {
  HangDetector d = Detector();
  d.Observe(Step(0, 1, 1.0), kStart + absl::Seconds(1));
  EXPECT_EQ(d.Timeout(), absl::Seconds(10));  // 5 x 1 s is under the floor
  d.Observe(Step(0, 2, 4.0), kStart + absl::Seconds(5));
  EXPECT_EQ(d.Timeout(), absl::Seconds(20));  // 5 x the slowest step
}

TEST(HangDetector, ProgressInCollectivesIsNotAHang) {
  HangDetector d = Detector(absl::Seconds(5));
  d.Observe(Step(0, 1, 0.5), kStart);  // past the start: the fixed timeout holds
  for (int t = 1; t <= 20; ++t) {
    d.Observe(Report(0, 1, t, t), kStart + absl::Seconds(t));
    d.Observe(Report(1, 1, t, t), kStart + absl::Seconds(t));
  }
  EXPECT_FALSE(d.Check(kStart + absl::Seconds(24)).has_value());
  EXPECT_TRUE(d.Check(kStart + absl::Seconds(26)).has_value());
}

TEST(HangDetector, CheckpointPhaseExtendsTheTimeout) {
  HangDetector d = Detector(absl::Seconds(5));
  d.Observe(Step(0, 1, 0.5), kStart);  // past the start: the fixed timeout holds
  d.Observe(Report(0, 3, 3, 3, "checkpoint"), kStart);
  EXPECT_EQ(d.Timeout(), absl::Seconds(35));
}

TEST(HangDetector, SilentRankIsTheCulprit) {
  HangDetector d = Detector(absl::Seconds(5));
  d.Observe(Step(0, 1, 0.5), kStart);  // past the start: the fixed timeout holds
  // Rank 1 stopped at t=2 in the middle of the collective both entered.
  d.Observe(Report(1, 4, 5, 4, "reduce_gradients", "all_reduce"), kStart + absl::Seconds(2));
  for (int t = 2; t <= 9; ++t) {
    d.Observe(Report(0, 4, 5, 4, "reduce_gradients", "all_reduce"), kStart + absl::Seconds(t));
  }
  auto hang = d.Check(kStart + absl::Seconds(9));
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->culprit_rank, 1);
  EXPECT_THAT(hang->diagnosis, HasSubstr("rank 1 TP(0)-CP(0)-PP(0)-DP(1)-Rank(1)"));
  EXPECT_THAT(hang->diagnosis, HasSubstr("stopped reporting"));
  EXPECT_THAT(hang->diagnosis, HasSubstr("waiting in all_reduce on dp[0,1] #5"));
}

TEST(HangDetector, LaggingSequenceNumberIsTheCulprit) {
  HangDetector d = Detector(absl::Seconds(5));
  d.Observe(Step(0, 1, 0.5), kStart);  // past the start: the fixed timeout holds
  // Both still report; rank 0 waits in collective #5, rank 1 never issued it.
  for (int t = 0; t <= 9; ++t) {
    d.Observe(Report(0, 4, 5, 4, "reduce_gradients", "all_reduce"), kStart + absl::Seconds(t));
    d.Observe(Report(1, 4, 4, 4, "forward_backward"), kStart + absl::Seconds(t));
  }
  auto hang = d.Check(kStart + absl::Seconds(9));
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->culprit_rank, 1);
  EXPECT_THAT(hang->diagnosis, HasSubstr("sequence number on group dp[0,1] is 4 while its peers are at 5"));
}

TEST(HangDetector, RankThatNeverReportedIsTheCulprit) {
  HangDetector d = Detector(absl::Seconds(5));
  d.Observe(Step(0, 1, 0.5), kStart);  // past the start: the fixed timeout holds
  d.Observe(Report(0, 0, 1, 0, "running", "all_reduce"), kStart);
  auto hang = d.Check(kStart + absl::Seconds(6));
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->culprit_rank, 1);
  EXPECT_THAT(hang->diagnosis, HasSubstr("never reported"));
}

}  // namespace
}  // namespace loom::coordinator
