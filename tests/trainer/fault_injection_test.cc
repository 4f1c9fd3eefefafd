// The fault drills' plan (LOOM_TEST_FAULT, worker/trainer/fault_injection.h):
// the bad-step points parse, reach only the rank and attempt they name, and
// a loss spike refuses a #RANK (the loss is the job's).
#include "worker/trainer/fault_injection.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace loom::trainer {
namespace {

class ScopedFault {
 public:
  explicit ScopedFault(const char* text) { setenv("LOOM_TEST_FAULT", text, 1); }
  ~ScopedFault() { unsetenv("LOOM_TEST_FAULT"); }
};

TEST(FaultPlanTest, BadStepPointsParseAndLossSpikeTakesNoRank) {
  absl::StatusOr<FaultPlan> nan = ParseFaultPlan("nan_grad@7#1");
  ASSERT_TRUE(nan.ok()) << nan.status();
  EXPECT_EQ(nan->point, "nan_grad");
  EXPECT_EQ(nan->step, 7);
  EXPECT_EQ(nan->rank, 1);
  EXPECT_TRUE(ParseFaultPlan("loss_spike@3:always").ok());
  absl::StatusOr<FaultPlan> ranked = ParseFaultPlan("loss_spike@3#0");
  EXPECT_FALSE(ranked.ok());
  EXPECT_NE(ranked.status().message().find("loss_spike takes no #RANK"), std::string::npos)
      << ranked.status();
  EXPECT_FALSE(ParseFaultPlan("nan_gradient@3").ok());  // unknown point
}

TEST(FaultPlanTest, StepFaultsReachOnlyTheNamedRankAndTheFirstAttempt) {
  {
    ScopedFault fault("nan_grad@4#1");
    absl::StatusOr<engine::StepFaults> mine = StepFaultsFor(1, 1);
    ASSERT_TRUE(mine.ok());
    EXPECT_EQ(mine->nan_gradient_step, 4);
    EXPECT_EQ(mine->loss_spike_step, 0);
    EXPECT_EQ(StepFaultsFor(0, 1)->nan_gradient_step, 0);  // another rank
    EXPECT_EQ(StepFaultsFor(1, 2)->nan_gradient_step, 0);  // a later attempt
    // A bad-step drill installs nothing that kills the rank.
    absl::StatusOr<std::function<void(int64_t)>> check = InstallFaultPlan(1, 1);
    ASSERT_TRUE(check.ok());
    (*check)(4);
  }
  {
    ScopedFault fault("loss_spike@5:always");
    EXPECT_EQ(StepFaultsFor(3, 2)->loss_spike_step, 5);
  }
  EXPECT_EQ(StepFaultsFor(0, 1)->loss_spike_step, 0);  // unset: none
}

}  // namespace
}  // namespace loom::trainer
