// The durable job store: what is put survives closing and reopening the
// database, in submission order, and sequence numbers continue.
#include "coordinator/jobs/sqlite_job_store.h"

#include <filesystem>

#include "coordinator/jobs/job_states.h"
#include "gtest/gtest.h"
#include "tests/common/scratch_dir.h"

namespace loom::coordinator {
namespace {

loom::v1::Job MakeJob(const std::string& id, loom::v1::JobState state) {
  loom::v1::Job job;
  job.set_id(id);
  job.set_name("n-" + id);
  job.set_state(state);
  job.set_attempt(2);
  job.set_spec_yaml("name: x\n");
  loom::v1::JobEvent* event = job.add_history();
  event->set_state(state);
  event->set_message("hello");
  return job;
}

TEST(JobStore, SurvivesReopen) {
  const loom::testing::ScratchDir scratch("loom_job_store");
  const std::string dir = scratch / "state";  // SqliteJobStore::Open makes it
  {
    auto store = SqliteJobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put(MakeJob("job-000002", loom::v1::RUNNING)).ok());
    ASSERT_TRUE((*store)->Put(MakeJob("job-000001", loom::v1::PENDING)).ok());
    // Replace: the newest record of a job wins.
    ASSERT_TRUE((*store)->Put(MakeJob("job-000001", loom::v1::SUCCEEDED)).ok());
  }
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "job-000001");
  EXPECT_EQ((*jobs)[0].state(), loom::v1::SUCCEEDED);
  EXPECT_EQ((*jobs)[1].state(), loom::v1::RUNNING);
  EXPECT_EQ((*jobs)[1].attempt(), 2);
  EXPECT_EQ((*jobs)[1].history(0).message(), "hello");
  EXPECT_EQ(*(*store)->MaxSequence(), 2);
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(dir) / "loom.db-wal") ||
              std::filesystem::exists(std::filesystem::path(dir) / "loom.db"));
}

TEST(JobStore, DeletedJobsAreGoneButTheirSequenceIsNeverReused) {
  const loom::testing::ScratchDir scratch("loom_job_store_delete");
  const std::string dir = scratch / "state";
  {
    auto store = SqliteJobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    for (const char* id : {"job-000001", "job-000002", "job-000003"}) {
      ASSERT_TRUE((*store)->Put(MakeJob(id, loom::v1::SUCCEEDED)).ok());
    }
    ASSERT_TRUE((*store)->Delete({"job-000002", "job-000003"}).ok());
    ASSERT_TRUE((*store)->Delete({}).ok());
  }
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->LoadAll();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].id(), "job-000001");
  EXPECT_EQ(*(*store)->MaxSequence(), 3);
}

TEST(JobStore, StepsAreStoredInChunksBoundedAndDeletedWithTheirJob) {
  const loom::testing::ScratchDir scratch("loom_job_store_steps");
  const std::string dir = scratch / "state";
  auto chunk = [](int64_t index, int64_t first, int64_t count) {
    StepChunk c{.job_id = "job-000001", .index = index, .steps = {}};
    for (int64_t s = first; s < first + count; ++s) c.steps.add_steps()->set_step(s);
    return c;
  };
  {
    auto store = SqliteJobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    const loom::v1::Job job = MakeJob("job-000001", loom::v1::RUNNING);
    JobWrite write;
    write.jobs = {&job};
    write.step_chunks = {chunk(0, 1, kStepsPerChunk), chunk(1, 257, 10)};
    ASSERT_TRUE((*store)->Write(write).ok());
    // The bound moves on: chunk 0 goes, chunk 1 grows, chunk 2 begins.
    JobWrite next;
    next.step_chunks = {chunk(1, 257, kStepsPerChunk), chunk(2, 513, 3)};
    next.keep_chunks_from["job-000001"] = 1;
    ASSERT_TRUE((*store)->Write(next).ok());
  }
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok());
  auto steps = (*store)->LoadSteps();
  ASSERT_TRUE(steps.ok()) << steps.status();
  const StoredSteps& stored = steps->at("job-000001");
  EXPECT_EQ(stored.first, kStepsPerChunk);  // the series goes on numbering from chunk 1
  ASSERT_EQ(stored.steps.size(), static_cast<size_t>(kStepsPerChunk + 3));
  EXPECT_EQ(stored.steps.front().step(), 257);
  EXPECT_EQ(stored.steps.back().step(), 515);
  ASSERT_TRUE((*store)->Delete({"job-000001"}).ok());
  EXPECT_TRUE((*store)->LoadSteps()->empty());
}

TEST(JobStore, UnwritableStateDirIsNamed) {
  auto store = SqliteJobStore::Open("/proc/loom-cannot-exist/state");
  ASSERT_FALSE(store.ok());
  EXPECT_NE(std::string(store.status().message()).find("/proc/loom-cannot-exist/state"),
            std::string::npos);
}

TEST(JobStates, Transitions) {
  using loom::v1::JobState;
  EXPECT_TRUE(CanTransition(JobState::PENDING, JobState::STARTING));
  EXPECT_TRUE(CanTransition(JobState::STARTING, JobState::RUNNING));
  EXPECT_TRUE(CanTransition(JobState::RUNNING, JobState::SUCCEEDED));
  EXPECT_TRUE(CanTransition(JobState::RUNNING, JobState::RESTARTING));
  EXPECT_TRUE(CanTransition(JobState::RESTARTING, JobState::STARTING));
  EXPECT_TRUE(CanTransition(JobState::PENDING, JobState::CANCELLED));
  EXPECT_FALSE(CanTransition(JobState::PENDING, JobState::SUCCEEDED));
  EXPECT_FALSE(CanTransition(JobState::SUCCEEDED, JobState::RUNNING));
  EXPECT_FALSE(CanTransition(JobState::CANCELLED, JobState::FAILED));
  EXPECT_FALSE(CanTransition(JobState::RUNNING, JobState::PENDING));
  EXPECT_TRUE(IsTerminal(JobState::FAILED));
  EXPECT_FALSE(IsTerminal(JobState::RESTARTING));
}

}  // namespace
}  // namespace loom::coordinator
