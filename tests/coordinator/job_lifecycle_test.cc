// The lifecycle (coordinator/jobs/job_lifecycle.h) over the job table, a
// persister and a store that fails on demand: a failure restarts the whole
// job (its kills leave once RESTARTING is stored) or fails it past its
// budget; a coordinator that stopped acting takes no event for a failure; a
// restarting attempt counts its exits again from a node's registration and
// has the ranks it still runs killed; a job stored while recovering in place
// before its next attempt was placed restarts whole; a cancel that cannot be
// stored is put back. (The in-place path itself, which needs the scheduler,
// is tested through the JobManager: in_place_recovery_test.cc.)
#include "coordinator/jobs/job_lifecycle.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/exit_codes.h"
#include "coordinator/jobs/job_states.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_job_store.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;
using loom::v1::JobState;

class JobLifecycleTest : public ::testing::Test {
 protected:
  JobLifecycleTest()
      : persister_(&store_, {.first_retry = absl::Milliseconds(1),
                             .max_retry = absl::Milliseconds(5)}),
        table_({}, &persister_, &hub_),
        metrics_(nullptr),
        lifecycle_({.kill_grace_seconds = 2}, &table_, &hub_, &metrics_, &nodes_, &kv_) {
    persister_.Start([this](std::vector<WriteResult> r) { table_.OnWritten(std::move(r)); },
                     [](const absl::Status&) {});
  }
  ~JobLifecycleTest() override { persister_.Stop(); }

  // A job of two ranks on node-a in `state`, attempt `attempt`, as the store
  // holds it; recovered: loaded by this coordinator at start.
  std::string Add(JobState state, int32_t attempt = 1, bool recovered = false,
                  int64_t max_restarts = 2) {
    absl::MutexLock lock(&table_.mu());
    JobRecord record;
    record.job.set_id(table_.NewIdLocked(&record.sequence));
    record.job.set_state(state);
    record.job.set_attempt(attempt);
    record.job.set_store_namespace(absl::StrCat(record.job.id(), "/attempt-", attempt, "-x"));
    record.spec.fault_tolerance.max_restarts = max_restarts;
    auto placement = std::make_shared<Placement>();
    for (int rank = 0; rank < 2; ++rank) {
      loom::v1::RankPlacement* p = placement->Add();
      p->set_rank(rank);
      p->set_node_id("node-a");
      p->set_local_device(rank);
      p->set_place(absl::StrCat("Rank(", rank, ")"));
    }
    record.placement = placement;
    record.ranks.resize(2);
    JobRecord& inserted = table_.InsertLocked(std::move(record));
    if (recovered) lifecycle_.RecoveredLocked(inserted, absl::Now());
    kv_.OpenNamespace(inserted.job.store_namespace());
    return inserted.job.id();
  }

  loom::v1::RankExited Exit(const std::string& id, int32_t rank, int code, int32_t attempt = 1) {
    loom::v1::RankExited exit;
    exit.set_job_id(id);
    exit.set_attempt(attempt);
    exit.set_rank(rank);
    exit.set_exit_code(code);
    return exit;
  }

  std::vector<loom::v1::CoordinatorMessage> Sent(const std::string& node = "node-a") {
    absl::MutexLock lock(&table_.mu());
    std::vector<loom::v1::CoordinatorMessage> sent;
    for (auto& [to, message] : table_.TakeOutboxLocked()) {
      if (to == node) sent.push_back(message);
    }
    return sent;
  }

  JobState Stored(const std::string& id) { return store_.jobs().at(id).state(); }

  testing::FakeJobStore store_;
  WatchHub hub_;
  JobPersister persister_;
  JobTable table_;
  JobMetrics metrics_;
  NodeRegistry nodes_;
  KvStore kv_;
  JobLifecycle lifecycle_;
};

TEST_F(JobLifecycleTest, ACrashRestartsTheWholeJobAndItsKillsLeaveOnceThatIsStored) {
  const std::string id = Add(JobState::RUNNING);
  store_.FailNext(1000000);  // the store is down: RESTARTING is not stored
  lifecycle_.OnRankExited("node-a", Exit(id, 1, 1));
  while (store_.writes() < 2) absl::SleepFor(absl::Milliseconds(1));  // and is retried
  EXPECT_TRUE(Sent().empty());  // the kill waits for the store
  EXPECT_EQ(table_.Get(id)->state(), JobState::RUNNING);  // readers see what is stored
  store_.FailNext(0);
  persister_.WaitIdle();
  EXPECT_EQ(Stored(id), JobState::RESTARTING);
  const auto sent = Sent();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].kill().job_id(), id);
  EXPECT_EQ(sent[0].kill().attempt(), 1);
  EXPECT_EQ(sent[0].kill().grace_seconds(), 2);
  const loom::v1::Job job = *table_.Get(id);
  EXPECT_EQ(job.crash_restarts(), 1);
  EXPECT_THAT(job.history(job.history_size() - 1).message(),
              HasSubstr("crash restart 1 of 2: rank 1 Rank(1) on node node-a exited with code 1"));
  ASSERT_EQ(job.incidents_size(), 1);
  EXPECT_EQ(job.incidents(0).path(), "whole_job");
  // In place was asked for (the spec's default), but no node is live to
  // relaunch rank 1 on.
  EXPECT_THAT(job.incidents(0).fallback_reason(),
              HasSubstr("no live node of the job's device kind has a free device to relaunch "
                        "rank 1"));
  // The last rank's exit ends the attempt: its namespace goes.
  const std::string ns = absl::StrCat(id, "/attempt-1-x");
  EXPECT_TRUE(kv_.Set(ns, "k", "v").ok());
  lifecycle_.OnRankExited("node-a", Exit(id, 0, 143));
  persister_.WaitIdle();
  EXPECT_EQ(kv_.Set(ns, "k", "v").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table_.Get(id)->state(), JobState::RESTARTING);  // placed later, by the scheduler
  EXPECT_TRUE(table_.CheckInvariants().ok()) << table_.CheckInvariants();
}

TEST_F(JobLifecycleTest, AGracefulStopTellsTheNodesAndTheStoppedExitsMakeItPreempted) {
  const std::string id = Add(JobState::RUNNING);
  {
    absl::MutexLock lock(&table_.mu());
    JobRecord& record = table_.AtLocked(id);
    record.job.mutable_last_progress()->set_step(37);
    EXPECT_TRUE(lifecycle_.StopGracefullyLocked(record, "preempted by job-9 (priority 5)"));
    EXPECT_FALSE(lifecycle_.StopGracefullyLocked(record, "again"));  // told once
  }
  persister_.WaitIdle();
  const auto sent = Sent();
  ASSERT_EQ(sent.size(), 1u);  // one message for the node's two ranks
  EXPECT_EQ(sent[0].stop().job_id(), id);
  EXPECT_EQ(sent[0].stop().attempt(), 1);
  EXPECT_EQ(sent[0].stop().reason(), "preempted by job-9 (priority 5)");
  lifecycle_.OnRankExited("node-a", Exit(id, 0, kExitStopped));
  EXPECT_EQ(table_.Get(id)->state(), JobState::RUNNING);  // rank 1 still saves
  lifecycle_.OnRankExited("node-a", Exit(id, 1, kExitStopped));
  persister_.WaitIdle();
  const loom::v1::Job job = *table_.Get(id);
  EXPECT_EQ(job.state(), JobState::PREEMPTED);
  EXPECT_EQ(Stored(id), JobState::PREEMPTED);
  EXPECT_THAT(job.history(job.history_size() - 1).message(),
              HasSubstr("stopped after step 37 with a checkpoint of it (preempted by job-9 "
                        "(priority 5)); waits to resume from step 37"));
  EXPECT_EQ(job.restarts(), 0);  // not a failure
  EXPECT_EQ(job.preemptions(), 1);
  EXPECT_FALSE(job.has_stop());
  EXPECT_TRUE(job.store_namespace().empty());
  EXPECT_TRUE(Sent().empty());  // nothing killed
  EXPECT_TRUE(CanTransition(JobState::PREEMPTED, JobState::STARTING));
  EXPECT_FALSE(HoldsDevices(JobState::PREEMPTED));
  EXPECT_TRUE(table_.CheckInvariants().ok()) << table_.CheckInvariants();
}

TEST_F(JobLifecycleTest, RanksThatStopOnASignalFromOutsideMakeTheJobPreemptedToo) {
  const std::string id = Add(JobState::RUNNING);
  lifecycle_.OnRankExited("node-a", Exit(id, 1, kExitStopped));
  lifecycle_.OnRankExited("node-a", Exit(id, 0, kExitStopped));
  persister_.WaitIdle();
  const loom::v1::Job job = *table_.Get(id);
  EXPECT_EQ(job.state(), JobState::PREEMPTED);
  EXPECT_THAT(job.history(job.history_size() - 1).message(),
              HasSubstr("rank 1 on node node-a was asked to stop (a signal from outside)"));
  EXPECT_EQ(job.restarts(), 0);
}

TEST_F(JobLifecycleTest, AFailureWhileStoppingKillsTheOthersAndTheJobResumesFromItsNewestCheckpoint) {
  const std::string id = Add(JobState::RUNNING);
  {
    absl::MutexLock lock(&table_.mu());
    lifecycle_.StopGracefullyLocked(table_.AtLocked(id), "node node-a drained: repairs");
  }
  persister_.WaitIdle();
  ASSERT_EQ(Sent().size(), 1u);
  lifecycle_.OnRankExited("node-a", Exit(id, 0, kExitCrash));
  persister_.WaitIdle();
  const auto kills = Sent();
  ASSERT_EQ(kills.size(), 1u);
  EXPECT_EQ(kills[0].kill().job_id(), id);
  lifecycle_.OnRankExited("node-a", Exit(id, 1, 143));
  persister_.WaitIdle();
  const loom::v1::Job job = *table_.Get(id);
  EXPECT_EQ(job.state(), JobState::PREEMPTED);
  EXPECT_THAT(job.history(job.history_size() - 1).message(),
              HasSubstr("0 of 2 ranks after saving; waits to resume from its newest checkpoint"));
  EXPECT_EQ(job.restarts(), 0);
}

TEST_F(JobLifecycleTest, RanksThatHaveNotStoppedByTheDeadlineAreKilled) {
  const std::string id = Add(JobState::RUNNING);
  {
    absl::MutexLock lock(&table_.mu());
    lifecycle_.StopGracefullyLocked(table_.AtLocked(id), "preempted by job-9 (priority 5)");
  }
  persister_.WaitIdle();
  ASSERT_EQ(Sent().size(), 1u);
  lifecycle_.CheckHealth(absl::Now() + absl::Seconds(10));  // within the grace (120 s)
  persister_.WaitIdle();
  EXPECT_TRUE(Sent().empty());
  lifecycle_.CheckHealth(absl::Now() + absl::Seconds(121));
  lifecycle_.CheckHealth(absl::Now() + absl::Seconds(122));  // killed once
  persister_.WaitIdle();
  const auto kills = Sent();
  ASSERT_EQ(kills.size(), 1u);
  EXPECT_TRUE(kills[0].has_kill());
  EXPECT_THAT(table_.Get(id)->history(table_.Get(id)->history_size() - 1).message(),
              HasSubstr("did not stop within 2m"));
  lifecycle_.OnRankExited("node-a", Exit(id, 0, 143));
  lifecycle_.OnRankExited("node-a", Exit(id, 1, 143));
  persister_.WaitIdle();
  EXPECT_EQ(table_.Get(id)->state(), JobState::PREEMPTED);
}

TEST_F(JobLifecycleTest, PastItsBudgetTheJobFailsNamingTheRankAndTheBudget) {
  const std::string id = Add(JobState::RUNNING, 1, false, /*max_restarts=*/0);
  lifecycle_.OnRankExited("node-a", Exit(id, 0, 1));
  persister_.WaitIdle();
  const loom::v1::Job job = *table_.Get(id);
  EXPECT_EQ(job.state(), JobState::FAILED);
  EXPECT_THAT(job.failure_reason(), HasSubstr("rank 0 Rank(0) on node node-a exited with code 1"));
  EXPECT_THAT(job.failure_reason(), HasSubstr("(crash restart budget of 0 spent)"));
  EXPECT_EQ(Sent().size(), 1u);  // the survivors are killed
}

TEST_F(JobLifecycleTest, ACoordinatorThatStoppedActingTakesNoSessionEndForALostNode) {
  const std::string id = Add(JobState::RUNNING);
  {
    absl::MutexLock lock(&table_.mu());
    (void)table_.StopActingLocked(false, absl::UnavailableError("stopping"));
  }
  lifecycle_.OnNodeLost("node-a", "its agent's session ended");
  lifecycle_.OnRankExited("node-a", Exit(id, 0, 1));
  persister_.WaitIdle();
  EXPECT_EQ(table_.Get(id)->state(), JobState::RUNNING);
  EXPECT_EQ(table_.Get(id)->restarts(), 0);
  EXPECT_TRUE(store_.jobs().empty());  // nothing was written for it
  EXPECT_TRUE(Sent().empty());
}

TEST_F(JobLifecycleTest, ARestartingAttemptCountsItsExitsAgainFromARegistrationAndKillsAgain) {
  // Stored RESTARTING by a coordinator that stopped before it heard every
  // exit (or sent every kill): this one loaded it.
  const std::string id = Add(JobState::RESTARTING, 1, /*recovered=*/true);
  loom::v1::RegisterNode registration;
  registration.set_node_id("node-a");
  loom::v1::RunningRank* still = registration.add_running();
  still->set_job_id(id);
  still->set_attempt(1);
  still->set_rank(1);
  loom::v1::RunningRank* stale = registration.add_running();  // an attempt long gone
  stale->set_job_id(id);
  stale->set_attempt(0);
  stale->set_rank(0);
  lifecycle_.OnNodeRegistered(registration);
  persister_.WaitIdle();
  auto sent = Sent();
  ASSERT_EQ(sent.size(), 2u);
  std::set<int32_t> attempts;
  for (const auto& m : sent) {
    ASSERT_TRUE(m.has_kill());
    EXPECT_EQ(m.kill().job_id(), id);
    attempts.insert(m.kill().attempt());
  }
  EXPECT_EQ(attempts, (std::set<int32_t>{0, 1}));
  {
    absl::MutexLock lock(&table_.mu());
    EXPECT_EQ(table_.AtLocked(id).ranks_exited, 1u);  // rank 0: not running, so exited
    table_.TakeScheduleRequestLocked();
  }
  // Rank 1's exit after the kill: every rank is out, placement may go on.
  lifecycle_.OnRankExited("node-a", Exit(id, 1, 143));
  absl::MutexLock lock(&table_.mu());
  EXPECT_EQ(table_.AtLocked(id).ranks_exited, 2u);
  EXPECT_TRUE(table_.ScheduleRequestedLocked());
  EXPECT_TRUE(table_.AtLocked(id).job.store_namespace().empty());
}

TEST_F(JobLifecycleTest, AJobStoredWhileRecoveringInPlaceRestartsWhole) {
  const std::string id = Add(JobState::RECOVERING, 2, /*recovered=*/true);
  persister_.WaitIdle();
  const loom::v1::Job job = *table_.Get(id);
  EXPECT_EQ(job.state(), JobState::RESTARTING);
  EXPECT_EQ(job.restarts(), 0);  // counted when the recovery began
  EXPECT_THAT(job.history(job.history_size() - 1).message(),
              HasSubstr("the coordinator restarted during the recovery, before it was decided"));
  EXPECT_EQ(job.incidents_size(), 0);  // none was stored with it here
  EXPECT_EQ(Stored(id), JobState::RESTARTING);
}

TEST_F(JobLifecycleTest, ACancelThatCannotBeStoredIsPutBackAndSendsNothing) {
  const std::string id = Add(JobState::RUNNING);
  store_.FailNext(1, absl::InternalError("database or disk is full"));
  absl::Notification answered;
  absl::StatusOr<loom::v1::Job> answer;
  lifecycle_.Cancel(id, [&](absl::StatusOr<loom::v1::Job> job) {
    answer = std::move(job);
    answered.Notify();
  });
  answered.WaitForNotification();
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(answer.status().message()), HasSubstr("database or disk is full"));
  persister_.WaitIdle();
  EXPECT_EQ(table_.Get(id)->state(), JobState::RUNNING);
  EXPECT_TRUE(Sent().empty());
  EXPECT_TRUE(kv_.Set(absl::StrCat(id, "/attempt-1-x"), "k", "v").ok());  // still open
  EXPECT_TRUE(table_.CheckInvariants().ok()) << table_.CheckInvariants();

  absl::Notification again;
  lifecycle_.Cancel(id, [&](absl::StatusOr<loom::v1::Job> job) {
    answer = std::move(job);
    again.Notify();
  });
  again.WaitForNotification();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->state(), JobState::CANCELLED);
  EXPECT_TRUE(answer->store_namespace().empty());
  EXPECT_EQ(Stored(id), JobState::CANCELLED);
  EXPECT_EQ(Sent().size(), 1u);  // the kill, once stored
}

}  // namespace
}  // namespace loom::coordinator
