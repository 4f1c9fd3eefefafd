// The phases of a recovery and the job's goodput, fed with events and times:
// the whole-job path's and the in-place path's, a fallback from one to the
// other, and the steps recomputed.
#include "coordinator/health/recovery_accounting.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
absl::Time At(double seconds) { return kT0 + absl::Seconds(seconds); }

TEST(RecoveryAccountingTest, PhasesLieBetweenConsecutiveEventsAndSumToTheRecovery) {
  loom::v1::Job job;
  job.set_attempt(1);
  EXPECT_FALSE(OpenIncident(job, "crash", 2, "n1", "rank 2 was killed\nlog...", At(0), At(0.25))
                   .has_value());
  MarkStopped(job, At(1.25));
  MarkPlaced(job, At(3.25));
  MarkReady(job, At(3.75));
  EXPECT_FALSE(MarkResumed(job, At(4.0)).has_value());
  std::optional<loom::v1::RecoveryIncident> done = MarkFirstStep(job, At(4.5), 6);
  ASSERT_TRUE(done.has_value());
  ASSERT_EQ(job.incidents_size(), 1);
  const loom::v1::RecoveryIncident& in = job.incidents(0);
  EXPECT_EQ(in.kind(), "crash");
  EXPECT_EQ(in.rank(), 2);
  EXPECT_EQ(in.failed_attempt(), 1);
  EXPECT_EQ(in.reason(), "rank 2 was killed");
  EXPECT_TRUE(in.complete());
  EXPECT_TRUE(in.closed());
  EXPECT_EQ(in.resumed_step(), 6);
  EXPECT_DOUBLE_EQ(in.detection_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(in.stopping_seconds(), 1.0);
  EXPECT_DOUBLE_EQ(in.placement_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(in.rendezvous_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(in.checkpoint_load_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(in.first_step_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(in.total_seconds(), 4.5);
  std::vector<std::pair<int, double>> phases = MeasuredPhases(in);
  ASSERT_EQ(phases.size(), 6u);
  double sum = 0;
  for (const auto& [phase, seconds] : phases) sum += seconds;
  EXPECT_DOUBLE_EQ(sum, in.total_seconds());
  EXPECT_STREQ(kRecoveryPhaseNames[phases[4].first], "checkpoint_load");
}

TEST(RecoveryAccountingTest, EventsWithoutAnOpenIncidentChangeNothing) {
  loom::v1::Job job;
  MarkReady(job, At(1));
  MarkResumed(job, At(2));
  EXPECT_FALSE(MarkFirstStep(job, At(3), 0).has_value());
  EXPECT_EQ(job.incidents_size(), 0);
}

TEST(RecoveryAccountingTest, TheRanksReportsMayArriveInAnyOrder) {
  // Rank 0's first step arrives before a slower rank's ready and resumed
  // reports: the incident completes with the last of them.
  loom::v1::Job job;
  OpenIncident(job, "hang", 1, "n1", "hang", At(0), At(4));
  EXPECT_FALSE(MarkStopped(job, At(6)).has_value());
  EXPECT_FALSE(MarkPlaced(job, At(7)).has_value());
  EXPECT_FALSE(MarkFirstStep(job, At(9), 4).has_value());
  EXPECT_FALSE(job.incidents(0).closed());
  EXPECT_DOUBLE_EQ(job.incidents(0).total_seconds(), 9);
  EXPECT_FALSE(MarkResumed(job, At(8.5)).has_value());
  std::optional<loom::v1::RecoveryIncident> done = MarkReady(job, At(8));
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->complete());
  EXPECT_DOUBLE_EQ(done->detection_seconds(), 4);
  EXPECT_DOUBLE_EQ(done->rendezvous_seconds(), 1);
  EXPECT_DOUBLE_EQ(done->checkpoint_load_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(done->first_step_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(done->total_seconds(), 9);
  EXPECT_EQ(MeasuredPhases(*done).size(), 6u);
}

TEST(RecoveryAccountingTest, AnIncidentMissingABoundaryClosesIncomplete) {
  // Ranks that never report "resumed": the job's end closes it.
  loom::v1::Job job;
  OpenIncident(job, "crash", 1, "n1", "x", At(0), At(1));
  MarkStopped(job, At(2));
  MarkPlaced(job, At(3));
  MarkReady(job, At(4));
  EXPECT_FALSE(MarkFirstStep(job, At(5), 0).has_value());
  std::optional<loom::v1::RecoveryIncident> closed = CloseIncident(job, At(20));
  ASSERT_TRUE(closed.has_value());
  EXPECT_FALSE(closed->complete());
  EXPECT_DOUBLE_EQ(closed->total_seconds(), 20);
  // Every phase but the two around the missing boundary.
  std::vector<std::pair<int, double>> phases = MeasuredPhases(*closed);
  ASSERT_EQ(phases.size(), 4u);
  EXPECT_EQ(phases.back().first, 3);  // rendezvous
}

TEST(RecoveryAccountingTest, BoundariesFromSkewedClocksStayInOrder) {
  loom::v1::Job job;
  OpenIncident(job, "crash", 0, "n1", "x", At(0), At(1));
  MarkStopped(job, At(2));
  MarkPlaced(job, At(3));
  MarkFirstStep(job, At(3.5), 0);   // a rank clock behind the coordinator's
  MarkReady(job, At(3.8));          // raises the first step to itself
  std::optional<loom::v1::RecoveryIncident> done = MarkResumed(job, At(3.6));
  ASSERT_TRUE(done.has_value());
  EXPECT_DOUBLE_EQ(done->checkpoint_load_seconds(), 0);
  EXPECT_DOUBLE_EQ(done->first_step_seconds(), 0);
  EXPECT_DOUBLE_EQ(done->total_seconds(), 3.8);
  double sum = 0;
  for (const auto& [phase, seconds] : MeasuredPhases(*done)) sum += seconds;
  EXPECT_DOUBLE_EQ(sum, done->total_seconds());
}

TEST(RecoveryAccountingTest, EachBoundaryIsSetOnceAndTimeNeverRunsBackwards) {
  loom::v1::Job job;
  OpenIncident(job, "crash", 0, "n1", "x", At(1), At(2));
  MarkStopped(job, At(1.5));  // before the declaration: counts as it
  MarkStopped(job, At(5));    // a second report changes nothing
  EXPECT_DOUBLE_EQ(job.incidents(0).stopping_seconds(), 0);
  // A cause after the declaration counts as the declaration.
  OpenIncident(job, "node_lost", -1, "n2", "y", At(10), At(9));
  EXPECT_DOUBLE_EQ(job.incidents(1).detection_seconds(), 0);
}

TEST(RecoveryAccountingTest, AFailureDuringARecoveryClosesTheFirstIncomplete) {
  loom::v1::Job job;
  OpenIncident(job, "crash", 0, "n1", "first", At(0), At(1));
  MarkStopped(job, At(2));
  MarkPlaced(job, At(3));
  std::optional<loom::v1::RecoveryIncident> cut =
      OpenIncident(job, "crash", 1, "n1", "second", At(3.5), At(4));
  ASSERT_TRUE(cut.has_value());
  EXPECT_FALSE(cut->complete());
  EXPECT_TRUE(cut->closed());
  EXPECT_DOUBLE_EQ(cut->total_seconds(), 4);  // until the second was declared
  EXPECT_EQ(MeasuredPhases(*cut).size(), 3u);
  ASSERT_EQ(job.incidents_size(), 2);
  EXPECT_FALSE(job.incidents(1).closed());
  // The job ends: the open one closes too.
  std::optional<loom::v1::RecoveryIncident> last = CloseIncident(job, At(10));
  ASSERT_TRUE(last.has_value());
  EXPECT_FALSE(last->complete());
  EXPECT_DOUBLE_EQ(last->total_seconds(), 6.5);
  EXPECT_FALSE(CloseIncident(job, At(11)).has_value());
}

TEST(RecoveryAccountingTest, AnIncidentKeepsABoundedFirstLineOfItsReason) {
  loom::v1::Job job;
  OpenIncident(job, "hang", 0, "n1", std::string(2000, 'x') + "\nmore", At(0), At(1));
  EXPECT_EQ(job.incidents(0).reason(), std::string(512, 'x'));
}

TEST(RecoveryAccountingTest, AJobKeepsTheLastIncidentsOnly) {
  loom::v1::Job job;
  for (int i = 0; i < kMaxIncidents + 5; ++i) {
    job.set_attempt(i + 1);
    OpenIncident(job, "crash", 0, "n1", "x", At(i), At(i));
  }
  ASSERT_EQ(job.incidents_size(), kMaxIncidents);
  EXPECT_EQ(job.incidents(0).failed_attempt(), 6);
  EXPECT_EQ(job.incidents(kMaxIncidents - 1).failed_attempt(), kMaxIncidents + 5);
  for (int i = 0; i + 1 < kMaxIncidents; ++i) EXPECT_TRUE(job.incidents(i).closed());
}

TEST(RecoveryAccountingTest, AnIncidentOpensOnTheWholeJobPathNotingTheNewestStep) {
  loom::v1::Job job;
  job.mutable_last_progress()->set_step(57);
  OpenIncident(job, "crash", 2, "n1", "x", At(0), At(1));
  const loom::v1::RecoveryIncident& in = job.incidents(0);
  EXPECT_EQ(in.path(), kPathWholeJob);
  EXPECT_EQ(in.last_step(), 57);
  EXPECT_TRUE(in.fallback_reason().empty());
  MarkStopped(job, At(2));
  MarkPlaced(job, At(3));
  MarkReady(job, At(4));
  MarkResumed(job, At(5));
  // The next attempt resumed after the checkpoint of step 50: 51-57 again.
  std::optional<loom::v1::RecoveryIncident> done = MarkFirstStep(job, At(6), 50);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->steps_recomputed(), 7);
  EXPECT_EQ(done->path(), kPathWholeJob);
}

TEST(RecoveryAccountingTest, InPlacePhasesAreDetectionAbortRelaunchRendezvousRestoreFirstStep) {
  loom::v1::Job job;
  job.set_attempt(3);
  job.mutable_last_progress()->set_step(8);
  OpenIncident(job, "crash", 2, "n1", "rank 2 was killed", At(0), At(0.25));
  EXPECT_FALSE(MarkInPlace(job, {2}).has_value());
  EXPECT_FALSE(MarkAborted(job, At(0.5)).has_value());
  MarkRestoreStep(job, 7, 8);
  // While it recovers, the steps it will recompute are known already.
  EXPECT_EQ(job.incidents(0).steps_recomputed(), 1);
  EXPECT_EQ(job.incidents(0).resumed_step(), 7);
  EXPECT_FALSE(MarkPlaced(job, At(1.0)).has_value());
  EXPECT_FALSE(MarkReady(job, At(1.25)).has_value());
  EXPECT_FALSE(MarkResumed(job, At(1.5)).has_value());
  std::optional<loom::v1::RecoveryIncident> done = MarkFirstStep(job, At(2.0), 7);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->complete());
  EXPECT_EQ(done->path(), kPathInPlace);
  EXPECT_EQ(std::vector<int32_t>(done->relaunched_ranks().begin(), done->relaunched_ranks().end()),
            std::vector<int32_t>{2});
  EXPECT_EQ(done->steps_recomputed(), 1);
  EXPECT_DOUBLE_EQ(done->detection_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(done->abort_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(done->stopping_seconds(), 0);
  EXPECT_DOUBLE_EQ(done->placement_seconds(), 0.5);  // the relaunch
  EXPECT_DOUBLE_EQ(done->rendezvous_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(done->checkpoint_load_seconds(), 0.25);  // the restore
  EXPECT_DOUBLE_EQ(done->first_step_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(done->total_seconds(), 2.0);
  std::vector<std::string> names;
  double sum = 0;
  for (const auto& [phase, seconds] : MeasuredPhases(*done)) {
    names.push_back(kRecoveryPhaseNames[phase]);
    sum += seconds;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"detection", "abort", "relaunch", "rendezvous",
                                             "restore", "first_step"}));
  EXPECT_DOUBLE_EQ(sum, done->total_seconds());
}

TEST(RecoveryAccountingTest, AKillOnTheInPlacePathIsNotAPhaseOfIt) {
  // The failed rank's kill completing (stopped) neither completes nor
  // measures anything on the in-place path: aborted is its boundary.
  loom::v1::Job job;
  OpenIncident(job, "hang", 1, "n1", "hang", At(0), At(1));
  MarkInPlace(job, {1});
  MarkStopped(job, At(1.5));
  MarkPlaced(job, At(3));
  MarkReady(job, At(4));
  MarkResumed(job, At(5));
  EXPECT_FALSE(MarkFirstStep(job, At(6), 4).has_value());
  EXPECT_FALSE(job.incidents(0).complete());
  EXPECT_DOUBLE_EQ(job.incidents(0).stopping_seconds(), 0);
  std::optional<loom::v1::RecoveryIncident> done = MarkAborted(job, At(2));
  ASSERT_TRUE(done.has_value());
  EXPECT_DOUBLE_EQ(done->abort_seconds(), 1);
  EXPECT_DOUBLE_EQ(done->placement_seconds(), 1);
}

TEST(RecoveryAccountingTest, AFallbackMovesTheIncidentToTheWholeJobPathWithItsReason) {
  loom::v1::Job job;
  job.mutable_last_progress()->set_step(10);
  OpenIncident(job, "node_lost", -1, "n2", "node n2 lost", At(0), At(1));
  MarkInPlace(job, {4, 5, 6, 7});
  MarkAborted(job, At(2));
  EXPECT_EQ(job.incidents(0).relaunched_ranks_size(), 4);
  EXPECT_FALSE(
      MarkWholeJob(job, "rank 5 and its buddy rank 1 failed together\nmore").has_value());
  const loom::v1::RecoveryIncident& in = job.incidents(0);
  EXPECT_EQ(in.path(), kPathWholeJob);
  EXPECT_EQ(in.fallback_reason(), "rank 5 and its buddy rank 1 failed together");
  EXPECT_EQ(in.relaunched_ranks_size(), 0);
  EXPECT_EQ(in.aborted_unix_us(), 0);
  EXPECT_DOUBLE_EQ(in.abort_seconds(), 0);
  MarkStopped(job, At(3));
  MarkPlaced(job, At(4));
  MarkReady(job, At(5));
  MarkResumed(job, At(6));
  std::optional<loom::v1::RecoveryIncident> done = MarkFirstStep(job, At(7), 4);
  ASSERT_TRUE(done.has_value());
  // The abort that was tried counts in stopping.
  EXPECT_DOUBLE_EQ(done->stopping_seconds(), 2);
  EXPECT_EQ(done->steps_recomputed(), 6);
  std::vector<std::string> names;
  for (const auto& [phase, seconds] : MeasuredPhases(*done)) {
    names.push_back(kRecoveryPhaseNames[phase]);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"detection", "stopping", "placement", "rendezvous",
                                             "checkpoint_load", "first_step"}));
}

TEST(RecoveryAccountingTest, StepsRecomputedCountTheNewestStepAnyRankReportedAndNeverGoNegative) {
  loom::v1::Job job;
  job.mutable_last_progress()->set_step(8);
  OpenIncident(job, "crash", 0, "n1", "x", At(0), At(1));
  MarkInPlace(job, {0});
  // A survivor's abort report shows step 9, newer than rank 0's last report.
  MarkRestoreStep(job, 7, 9);
  EXPECT_EQ(job.incidents(0).last_step(), 9);
  EXPECT_EQ(job.incidents(0).steps_recomputed(), 2);
  MarkRestoreStep(job, 7, 3);  // an older report lowers nothing
  EXPECT_EQ(job.incidents(0).last_step(), 9);

  loom::v1::Job fresh;
  fresh.mutable_last_progress()->set_step(3);
  OpenIncident(fresh, "crash", 0, "n1", "x", At(0), At(1));
  MarkFirstStep(fresh, At(2), 5);
  EXPECT_EQ(fresh.incidents(0).steps_recomputed(), 0);
}

TEST(RecoveryAccountingTest, ALateReportOfTheFailedAttemptRaisesTheNewestStep) {
  loom::v1::Job job;
  job.set_attempt(1);
  job.mutable_last_progress()->set_attempt(1);
  job.mutable_last_progress()->set_step(5);
  OpenIncident(job, "crash", 2, "n1", "x", At(0), At(1));
  // Rank 0's report of step 6 arrives after the declaration.
  job.mutable_last_progress()->set_step(6);
  MarkStopped(job, At(2));
  EXPECT_EQ(job.incidents(0).last_step(), 6);
  MarkPlaced(job, At(3));
  job.set_attempt(2);
  MarkReady(job, At(4));
  MarkResumed(job, At(5));
  // The new attempt's first step (after the checkpoint of step 4) is not one
  // of the failed attempt's.
  job.mutable_last_progress()->set_attempt(2);
  job.mutable_last_progress()->set_step(5);
  std::optional<loom::v1::RecoveryIncident> done = MarkFirstStep(job, At(6), 4);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->last_step(), 6);
  EXPECT_EQ(done->steps_recomputed(), 2);
}

TEST(RecoveryAccountingTest, PhaseLabelsAreDistinct) {
  std::set<std::string> labels(kRecoveryPhaseNames.begin(), kRecoveryPhaseNames.end());
  EXPECT_EQ(labels.size(), kRecoveryPhaseNames.size());
}

TEST(GoodputTest, StepsRedoneAfterARestartDoNotCount) {
  loom::v1::Job job;
  GoodputTracker tracker;
  EXPECT_EQ(GoodputTracker::Update(job, At(5)), 0);  // never ran
  GoodputTracker::Started(job, At(0));
  GoodputTracker::Started(job, At(50));  // a later RUNNING changes nothing
  for (int step = 1; step <= 8; ++step) tracker.OnStep(job, step, 1.0);
  EXPECT_DOUBLE_EQ(job.counted_step_seconds(), 8);
  EXPECT_DOUBLE_EQ(GoodputTracker::Update(job, At(10)), 0.8);
  // The next attempt resumed from the checkpoint of step 5: 6, 7, 8 are redone.
  tracker.OnStep(job, 6, 1.0);
  EXPECT_DOUBLE_EQ(job.counted_step_seconds(), 6);
  tracker.OnStep(job, 7, 1.0);
  EXPECT_DOUBLE_EQ(GoodputTracker::Update(job, At(20)), 7.0 / 20);
  EXPECT_DOUBLE_EQ(job.goodput(), 7.0 / 20);
}

TEST(GoodputTest, OnlyTheRememberedStepsCanBeTakenBack) {
  loom::v1::Job job;
  GoodputTracker tracker(/*max_steps=*/2);
  GoodputTracker::Started(job, At(0));
  for (int step = 1; step <= 4; ++step) tracker.OnStep(job, step, 1.0);
  tracker.OnStep(job, 1, 1.0);  // 3 and 4 are remembered and taken back
  EXPECT_DOUBLE_EQ(job.counted_step_seconds(), 3);
}

}  // namespace
}  // namespace loom::coordinator
