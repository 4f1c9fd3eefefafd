// Progress batches from node sessions (JobManager::OnRankProgressBatch): a
// batch moves the job (ranks ready, RUNNING, steps), a report for a rank that
// another node runs, or for another attempt, is refused and counted, and a
// batch larger than the bound is refused naming the rule. Rank exits are
// counted, not scanned: the last one ends the job.
#include <memory>
#include <string>

#include "absl/strings/str_replace.h"
#include "coordinator/cluster/node_limits.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/jobs/assignment_builder.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/sqlite_job_store.h"
#include "coordinator/rendezvous/kv_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/job_manager_harness.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;
using loom::v1::JobState;

using testing::kSmallDpSpec;

class ProgressBatchTest : public testing::JobManagerHarness {
 protected:
  ProgressBatchTest() : JobManagerHarness("loom_progress_batch") {}
  void SetUp() override { Start(); }

  // A placed job (STARTING).
  loom::v1::Job Placed() {
    auto job = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
    EXPECT_TRUE(job.ok()) << job.status();
    jobs_->WaitIdle();
    auto full = jobs_->Get(job->id(), loom::v1::JOB_VIEW_FULL);
    EXPECT_TRUE(full.ok());
    EXPECT_EQ(full->state(), JobState::STARTING);
    return *full;
  }
  static void Add(loom::v1::RankProgressBatch& batch, const loom::v1::Job& job, int rank,
                  const std::string& phase, int64_t step, int32_t attempt = 0) {
    loom::v1::RankProgress* p = batch.add_reports();
    p->set_job_id(job.id());
    p->set_attempt(attempt != 0 ? attempt : job.attempt());
    p->set_rank(rank);
    p->set_phase(phase);
    p->set_step(step);
    p->set_loss(2.5);
    p->set_time_unix_ms(absl::ToUnixMillis(absl::Now()) + step);
  }

};

TEST_F(ProgressBatchTest, ABatchMovesTheJobAndTheLastExitEndsIt) {
  AddNode("node-a", 2);
  const loom::v1::Job job = Placed();
  loom::v1::RankProgressBatch ready;
  Add(ready, job, 0, "ready", 0);
  Add(ready, job, 1, "ready", 0);
  ProgressBatchResult result = jobs_->OnRankProgressBatch("node-a", ready);
  EXPECT_EQ(result.applied, 2);
  EXPECT_EQ(result.refused, 0);
  jobs_->WaitIdle();  // readers see a state change once it is stored
  EXPECT_EQ(jobs_->Get(job.id())->state(), JobState::RUNNING);

  loom::v1::RankProgressBatch step;
  Add(step, job, 0, "step", 3);
  Add(step, job, 1, "step", 3);
  EXPECT_EQ(jobs_->OnRankProgressBatch("node-a", step).applied, 2);
  EXPECT_EQ(jobs_->Get(job.id())->last_progress().step(), 3);
  EXPECT_EQ(jobs_->Get(job.id())->last_progress().loss(), 2.5);

  loom::v1::RankExited exit;
  exit.set_job_id(job.id());
  exit.set_attempt(job.attempt());
  exit.set_rank(0);
  jobs_->OnRankExited("node-a", exit);
  jobs_->OnRankExited("node-a", exit);  // twice: counted once
  jobs_->WaitIdle();
  EXPECT_EQ(jobs_->Get(job.id())->state(), JobState::RUNNING);
  exit.set_rank(1);
  jobs_->OnRankExited("node-a", exit);
  jobs_->WaitIdle();
  EXPECT_EQ(jobs_->Get(job.id())->state(), JobState::SUCCEEDED);
}

TEST_F(ProgressBatchTest, ReportsForRanksOfAnotherNodeOrAttemptAreRefusedAndCounted) {
  AddNode("node-a", 1);
  AddNode("node-b", 1);
  const loom::v1::Job job = Placed();
  ASSERT_EQ(job.placement_size(), 2);
  const std::string& node0 = job.placement(0).node_id();
  const std::string& node1 = job.placement(1).node_id();
  ASSERT_NE(node0, node1);

  // node0 speaks for rank 1 (node1's) and for its own rank in another
  // attempt: neither counts.
  loom::v1::RankProgressBatch forged;
  Add(forged, job, 1, "ready", 0);
  Add(forged, job, 0, "ready", 0, job.attempt() + 1);
  Add(forged, job, 5, "ready", 0);  // no such rank
  loom::v1::RankProgress* unknown = forged.add_reports();
  unknown->set_job_id("job-999999");
  ProgressBatchResult result = jobs_->OnRankProgressBatch(node0, forged);
  EXPECT_EQ(result.applied, 0);
  EXPECT_EQ(result.refused, 4);
  EXPECT_THAT(result.first_refused, HasSubstr(" rank 1"));
  EXPECT_EQ(result.stale, 0);

  // An earlier attempt's last reports, still draining after a restart, are
  // ignored without counting as refused.
  loom::v1::RankProgressBatch draining;
  loom::v1::RankProgress* old_attempt = draining.add_reports();
  old_attempt->set_job_id(job.id());
  old_attempt->set_attempt(job.attempt() - 1);
  old_attempt->set_rank(0);
  old_attempt->set_phase("ready");
  result = jobs_->OnRankProgressBatch(node0, draining);
  EXPECT_EQ(result.applied, 0);
  EXPECT_EQ(result.refused, 0);
  EXPECT_EQ(result.stale, 1);

  // Its own rank counts; rank 1 is still not ready, so the job still starts.
  loom::v1::RankProgressBatch own;
  Add(own, job, 0, "ready", 0);
  Add(own, job, 1, "ready", 0);
  result = jobs_->OnRankProgressBatch(node0, own);
  EXPECT_EQ(result.applied, 1);
  EXPECT_EQ(result.refused, 1);
  jobs_->WaitIdle();
  EXPECT_EQ(jobs_->Get(job.id())->state(), JobState::STARTING);

  loom::v1::RankProgressBatch other;
  Add(other, job, 1, "ready", 0);
  EXPECT_EQ(jobs_->OnRankProgressBatch(node1, other).applied, 1);
  jobs_->WaitIdle();
  EXPECT_EQ(jobs_->Get(job.id())->state(), JobState::RUNNING);
}

// A rank's report beyond what its job allows (report_bounds.h) is refused
// like a forged one: nothing of it is applied, it is counted.
TEST_F(ProgressBatchTest, AReportBeyondItsJobsBoundsIsRefused) {
  AddNode("node-a", 2);
  const loom::v1::Job job = Placed();
  loom::v1::RankProgressBatch beyond;
  Add(beyond, job, 0, "ready", 0);
  for (int e = 0; e < 450; ++e) beyond.mutable_reports(0)->mutable_moe()->add_tokens_per_expert(1);
  Add(beyond, job, 1, "step", 6);  // the job trains 5 steps
  ProgressBatchResult result = jobs_->OnRankProgressBatch("node-a", beyond);
  EXPECT_EQ(result.applied, 0);
  EXPECT_EQ(result.refused, 2);
  jobs_->WaitIdle();
  EXPECT_EQ(jobs_->Get(job.id())->state(), JobState::STARTING);
}

TEST(ProgressBatchBoundTest, ABatchAboveTheBoundIsRefusedNamingTheRule) {
  loom::v1::RankProgressBatch batch;
  for (int i = 0; i < 1024; ++i) batch.add_reports()->set_rank(i);
  EXPECT_TRUE(CheckProgressBatch(batch).ok());
  batch.add_reports();
  const absl::Status status = CheckProgressBatch(batch);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("progress.reports holds 1025 reports; at most 1024"));
  NodeLimits tight;
  tight.max_progress_batch = 8;
  batch.mutable_reports()->DeleteSubrange(0, batch.reports_size() - 9);
  EXPECT_FALSE(CheckProgressBatch(batch, tight).ok());
}

}  // namespace
}  // namespace loom::coordinator
