// The recovery policy (coordinator/jobs/recovery_policy.h), pure: budgets per
// failure kind, the backoff, cordons, the two recovery paths and why in place
// is refused; and the job state machine with RECOVERING.
#include "coordinator/jobs/recovery_policy.h"

#include "coordinator/jobs/job_states.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;
using loom::v1::JobState;

loom::v1::Job Running() {
  loom::v1::Job job;
  job.set_id("job-000001");
  job.set_state(JobState::RUNNING);
  return job;
}

Failure Crash(const std::string& node = "node-a") {
  return {.kind = FailureKind::kCrash, .reason = "rank 1 was killed", .node_id = node, .rank = 1};
}

TEST(RecoveryPolicy, RestartsTheWholeJobWithinTheBudgetThenFails) {
  spec::FaultToleranceSpec ft;
  ft.max_restarts = 2;
  ft.restart_backoff_s = 1;
  loom::v1::Job job = Running();
  const Failure failure = Crash();
  RecoveryDecision first = DecideRecovery({.job = job, .fault_tolerance = ft, .failure = failure});
  EXPECT_EQ(first.path, RecoveryPath::kWholeJob);
  EXPECT_EQ(first.restart_number, 1);
  EXPECT_EQ(first.budget, 2);
  EXPECT_EQ(first.backoff, absl::Seconds(1));
  EXPECT_EQ(first.incident_kind, "crash");
  EXPECT_EQ(first.message, "crash restart 1 of 2: rank 1 was killed");
  CountRestart(job, FailureKind::kCrash);
  RecoveryDecision second = DecideRecovery({.job = job, .fault_tolerance = ft, .failure = failure});
  EXPECT_EQ(second.path, RecoveryPath::kWholeJob);
  EXPECT_EQ(second.backoff, absl::Seconds(2));  // doubled per restart of the kind
  CountRestart(job, FailureKind::kCrash);
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_EQ(job.crash_restarts(), 2);
  RecoveryDecision spent = DecideRecovery({.job = job, .fault_tolerance = ft, .failure = failure});
  EXPECT_EQ(spent.path, RecoveryPath::kFail);
  EXPECT_EQ(spent.message, "rank 1 was killed (crash restart budget of 2 spent)");
}

TEST(RecoveryPolicy, AStragglerCordonsItsNodeAtOnceAndSpendsTheHangBudget) {
  spec::FaultToleranceSpec ft;
  ft.max_restarts = 5;
  ft.max_hang_restarts = 1;
  ft.in_place = false;  // the whole job restarts, away from the cordoned node
  loom::v1::Job job = Running();
  const Failure slow{.kind = FailureKind::kStraggler,
                     .reason = "rank 2 is a straggler",
                     .node_id = "node-a",
                     .rank = 2};
  RecoveryDecision first =
      DecideRecovery({.job = job, .fault_tolerance = ft, .failure = slow, .node_failures = 1});
  EXPECT_TRUE(first.cordon);  // cordon_after (2) is not waited for
  EXPECT_THAT(first.cordon_reason, HasSubstr("a straggler of job job-000001: rank 2"));
  EXPECT_EQ(first.path, RecoveryPath::kWholeJob);
  EXPECT_EQ(first.incident_kind, "straggler");
  EXPECT_EQ(first.message, "straggler restart 1 of 1: rank 2 is a straggler");
  CountRestart(job, FailureKind::kStraggler);
  EXPECT_EQ(job.hang_restarts(), 1);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(DecideRecovery({.job = job, .fault_tolerance = ft, .failure = slow}).path,
            RecoveryPath::kFail);
}

TEST(RecoveryPolicy, EachKindHasItsOwnBudgetAndTheBackoffIsCapped) {
  spec::FaultToleranceSpec ft;
  ft.max_restarts = 0;
  ft.max_hang_restarts = 1;
  ft.max_node_restarts = 50;
  ft.restart_backoff_s = 10;
  loom::v1::Job job = Running();
  const Failure hang{.kind = FailureKind::kHang, .reason = "hang", .node_id = "n", .rank = 0};
  const Failure lost{.kind = FailureKind::kNodeLost, .reason = "lost", .node_id = "n", .rank = -1};
  EXPECT_EQ(DecideRecovery({.job = job, .fault_tolerance = ft, .failure = Crash()}).path,
            RecoveryPath::kFail);
  EXPECT_EQ(DecideRecovery({.job = job, .fault_tolerance = ft, .failure = hang}).incident_kind,
            "hang");
  for (int i = 0; i < 10; ++i) CountRestart(job, FailureKind::kNodeLost);
  const RecoveryDecision node = DecideRecovery({.job = job, .fault_tolerance = ft, .failure = lost});
  EXPECT_EQ(node.path, RecoveryPath::kWholeJob);
  EXPECT_EQ(node.incident_kind, "node_lost");
  EXPECT_EQ(node.backoff, absl::Seconds(60));  // never more than a minute
  EXPECT_EQ(job.hang_restarts(), 0);
}

TEST(RecoveryPolicy, ABrokenJobFailsAtOnceAndCordonsNothing) {
  spec::FaultToleranceSpec ft;
  ft.cordon_after = 1;
  const Failure broken{.kind = FailureKind::kJobBroken, .reason = "exit 3", .node_id = "n", .rank = 0};
  const RecoveryDecision decision = DecideRecovery(
      {.job = Running(), .fault_tolerance = ft, .failure = broken, .node_failures = 5});
  EXPECT_EQ(decision.path, RecoveryPath::kFail);
  EXPECT_EQ(decision.message, "exit 3");
  EXPECT_FALSE(decision.cordon);
  EXPECT_TRUE(decision.incident_kind.empty());
}

TEST(RecoveryPolicy, ANodeIsCordonedAfterFailingTheJobCordonAfterTimes) {
  spec::FaultToleranceSpec ft;
  ft.cordon_after = 2;
  EXPECT_FALSE(DecideRecovery({.job = Running(), .fault_tolerance = ft, .failure = Crash(),
                               .node_failures = 1})
                   .cordon);
  const RecoveryDecision second = DecideRecovery(
      {.job = Running(), .fault_tolerance = ft, .failure = Crash(), .node_failures = 2});
  EXPECT_TRUE(second.cordon);
  EXPECT_EQ(second.cordon_reason, "failed job job-000001 2 times");
  // No node to blame (a hang without a culprit): nothing is cordoned.
  EXPECT_FALSE(DecideRecovery({.job = Running(), .fault_tolerance = ft, .failure = Crash(""),
                               .node_failures = 9})
                   .cordon);
}

// A dp job of 4 ranks on two nodes of 2 devices (rank 1 on node-a fails),
// and a spare node of 1 device.
InPlaceRequest Request() {
  InPlaceRequest request;
  request.placement = {{"node-a", 0}, {"node-a", 1}, {"node-b", 0}, {"node-b", 1}};
  request.nodes = {{.node_id = "node-a", .free_devices = {0, 1}, .cordoned = false,
                    .nvlink_domain = ""},
                   {.node_id = "node-b", .free_devices = {0, 1}, .cordoned = false,
                    .nvlink_domain = ""},
                   {.node_id = "node-c", .free_devices = {0}, .cordoned = false,
                    .nvlink_domain = ""}};
  request.failed_ranks = {1};
  return request;
}

TEST(RecoveryPolicy, InPlaceWhenTheSpecTheStateAndTheFailureAllowIt) {
  spec::FaultToleranceSpec ft;  // in_place and snapshots by default
  ft.restart_backoff_s = 1;
  const loom::v1::Job job = Running();
  const Failure failure = Crash();
  const InPlaceRequest request = Request();
  RecoveryDecision without = DecideRecovery({.job = job, .fault_tolerance = ft, .failure = failure});
  EXPECT_EQ(without.path, RecoveryPath::kWholeJob);
  EXPECT_EQ(without.fallback_reason, "no in-place request was given");

  RecoveryDecision in_place = DecideRecovery(
      {.job = job, .fault_tolerance = ft, .failure = failure, .in_place = &request});
  EXPECT_EQ(in_place.path, RecoveryPath::kInPlace);
  EXPECT_TRUE(in_place.fallback_reason.empty());
  EXPECT_EQ(in_place.restart_number, 1);  // the budget counts both paths
  EXPECT_EQ(in_place.message, "crash restart 1 of 3: rank 1 was killed");
  // The whole job's backoff, should the recovery fall back.
  EXPECT_EQ(in_place.backoff, absl::Seconds(1));
  // PlanRelaunch's details: rank 1 back in its place, its copy from rank 3.
  ASSERT_EQ(in_place.relaunch.relaunched.size(), 1u);
  EXPECT_EQ(in_place.relaunch.relaunched[0].rank, 1);
  EXPECT_EQ(in_place.relaunch.relaunched[0].peer, 3);
  EXPECT_FALSE(in_place.relaunch.relaunched[0].moved());
  EXPECT_EQ(in_place.relaunch.restore_step, -1);  // chosen once the survivors reported

  // The spec first, then the job's state, then PlanRelaunch's rules.
  spec::FaultToleranceSpec off = ft;
  off.in_place = false;
  EXPECT_EQ(DecideRecovery({.job = job, .fault_tolerance = off, .failure = failure,
                            .in_place = &request})
                .fallback_reason,
            "in-place recovery is off (fault_tolerance.in_place: false)");
  spec::FaultToleranceSpec no_snapshots = ft;
  no_snapshots.snapshot_interval = 0;
  EXPECT_THAT(InPlaceRefusal({.job = job, .fault_tolerance = no_snapshots, .failure = failure,
                              .in_place = &request}),
              HasSubstr("snapshot_interval is 0"));
  loom::v1::Job recovering = job;
  recovering.set_state(JobState::RECOVERING);
  const RecoveryDecision second = DecideRecovery(
      {.job = recovering, .fault_tolerance = ft, .failure = failure, .in_place = &request});
  EXPECT_EQ(second.path, RecoveryPath::kWholeJob);
  EXPECT_EQ(second.fallback_reason, "a second failure while recovering in place");
  loom::v1::Job starting = job;
  starting.set_state(JobState::STARTING);
  EXPECT_EQ(InPlaceRefusal({.job = starting, .fault_tolerance = ft, .failure = failure,
                            .in_place = &request}),
            "the attempt had not started training (STARTING): there is no snapshot to roll back "
            "to");
  InPlaceRequest together = request;
  together.failed_ranks = {1, 3};
  EXPECT_THAT(DecideRecovery({.job = job, .fault_tolerance = ft, .failure = failure,
                              .in_place = &together})
                  .fallback_reason,
              HasSubstr("rank 1 and its buddy rank 3, which holds its snapshot copies, failed "
                        "together"));
}

TEST(RecoveryPolicy, ANodeCordonedNowTakesNoRelaunchedRank) {
  spec::FaultToleranceSpec ft;
  ft.cordon_after = 1;
  const InPlaceRequest request = Request();
  const RecoveryDecision decision =
      DecideRecovery({.job = Running(), .fault_tolerance = ft, .failure = Crash("node-a"),
                      .node_failures = 1, .in_place = &request});
  EXPECT_TRUE(decision.cordon);
  ASSERT_EQ(decision.path, RecoveryPath::kInPlace) << decision.fallback_reason;
  ASSERT_EQ(decision.relaunch.relaunched.size(), 1u);
  EXPECT_EQ(decision.relaunch.relaunched[0].to.node_id, "node-c");  // the spare
}

TEST(RecoveryPolicy, NoRoomForAJobThatMayShrinkStillAbortsInPlaceToSpill) {
  spec::FaultToleranceSpec ft;
  InPlaceRequest request = Request();
  request.nodes.clear();  // no live node has a free device
  RecoveryDecision decision =
      DecideRecovery({.job = Running(), .fault_tolerance = ft, .failure = Crash(), .in_place = &request});
  EXPECT_EQ(decision.path, RecoveryPath::kWholeJob);
  EXPECT_THAT(decision.fallback_reason, HasSubstr("no live node"));
  request.spill_when_no_room = true;
  decision =
      DecideRecovery({.job = Running(), .fault_tolerance = ft, .failure = Crash(), .in_place = &request});
  EXPECT_EQ(decision.path, RecoveryPath::kInPlace) << decision.fallback_reason;
  EXPECT_TRUE(decision.relaunch.spill);
  EXPECT_FALSE(decision.relaunch.in_place);
}

TEST(JobStates, RecoveringHoldsDevicesAndEndsInOneOfItsFourWays) {
  EXPECT_TRUE(HoldsDevices(JobState::RECOVERING));
  EXPECT_FALSE(IsTerminal(JobState::RECOVERING));
  EXPECT_TRUE(CanTransition(JobState::RUNNING, JobState::RECOVERING));
  EXPECT_TRUE(CanTransition(JobState::STARTING, JobState::RECOVERING));
  for (JobState to : {JobState::RUNNING, JobState::RESTARTING, JobState::FAILED,
                      JobState::CANCELLED}) {
    EXPECT_TRUE(CanTransition(JobState::RECOVERING, to)) << loom::v1::JobState_Name(to);
  }
  for (JobState to : {JobState::PENDING, JobState::STARTING, JobState::SUCCEEDED,
                      JobState::RECOVERING}) {
    EXPECT_FALSE(CanTransition(JobState::RECOVERING, to)) << loom::v1::JobState_Name(to);
  }
  EXPECT_FALSE(CanTransition(JobState::PENDING, JobState::RECOVERING));
  EXPECT_FALSE(CanTransition(JobState::RESTARTING, JobState::RECOVERING));
}

}  // namespace
}  // namespace loom::coordinator
