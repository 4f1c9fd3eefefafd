// The persister (coordinator/jobs/job_persister.h) over a store that fails on
// demand: the newest record of a job wins, every write happens on its one
// thread, a failure reaches its callers as UNAVAILABLE naming the cause and
// nothing is written, a fenced write stops it for good, and a stop writes
// what was queued.
#include "coordinator/jobs/job_persister.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_job_store.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;

PersistRequest Request(const std::string& id, loom::v1::JobState state, int64_t version) {
  PersistRequest request;
  request.job.set_id(id);
  request.job.set_state(state);
  request.version = version;
  auto placement = std::make_shared<Placement>();
  placement->Add()->set_node_id("node-a");
  request.placement = placement;
  return request;
}

class Results {
 public:
  void Add(std::vector<WriteResult> results) {
    absl::MutexLock lock(&mu_);
    for (WriteResult& r : results) results_.push_back(std::move(r));
  }
  std::vector<WriteResult> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<WriteResult> out;
    out.swap(results_);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<WriteResult> results_;
};

class JobPersisterTest : public ::testing::Test {
 protected:
  void Start(JobPersisterOptions options = {}) {
    persister_ = std::make_unique<JobPersister>(&store_, options);
    persister_->Start([this](std::vector<WriteResult> r) { results_.Add(std::move(r)); },
                      [this](const absl::Status& why) {
                        absl::MutexLock lock(&mu_);
                        fenced_.push_back(why);
                      });
  }

  testing::FakeJobStore store_;
  Results results_;
  absl::Mutex mu_;
  std::vector<absl::Status> fenced_;
  std::unique_ptr<JobPersister> persister_;
};

TEST_F(JobPersisterTest, TheNewestRecordWinsAndAllWritesAreOnOneThread) {
  Start();
  persister_->Put(Request("job-1", loom::v1::STARTING, 1));
  persister_->Put(Request("job-1", loom::v1::RUNNING, 2));
  persister_->Put(Request("job-2", loom::v1::PENDING, 1));
  persister_->WaitIdle();
  const auto stored = store_.jobs();
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_EQ(stored.at("job-1").state(), loom::v1::RUNNING);
  EXPECT_EQ(stored.at("job-1").placement_size(), 1);  // joined on the persister's thread
  std::vector<WriteResult> results = results_.Take();
  ASSERT_FALSE(results.empty());
  for (const WriteResult& r : results) {
    EXPECT_TRUE(r.status.ok());
    EXPECT_EQ(r.job->placement_size(), 0);  // readers get the placement apart
    EXPECT_EQ(r.placement->size(), 1);
  }
  EXPECT_EQ(results.back().job_id, "job-2");
  absl::Notification inserted;
  persister_->Insert({Request("job-3", loom::v1::PENDING, 0).job}, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    inserted.Notify();
  });
  inserted.WaitForNotification();
  absl::Notification deleted;
  persister_->Delete({"job-2"}, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    deleted.Notify();
  });
  deleted.WaitForNotification();
  EXPECT_EQ(store_.jobs().count("job-2"), 0u);
  EXPECT_EQ(store_.jobs().count("job-3"), 1u);
  const auto writers = store_.writers();
  EXPECT_EQ(writers.size(), 1u);
  EXPECT_EQ(writers.count(std::this_thread::get_id()), 0u);
}

TEST_F(JobPersisterTest, AFailedWriteIsUnavailableNamingTheCauseAndChangesNothing) {
  Start({.first_retry = absl::Milliseconds(1), .max_retry = absl::Milliseconds(2)});
  store_.FailNext(1, absl::InternalError("database or disk is full"));
  absl::Notification answered;
  absl::Status insert;
  persister_->Insert({Request("job-1", loom::v1::PENDING, 0).job}, [&](absl::Status s) {
    insert = s;
    answered.Notify();
  });
  answered.WaitForNotification();
  EXPECT_EQ(insert.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(insert.message()), HasSubstr("database or disk is full"));
  EXPECT_TRUE(store_.jobs().empty());

  // A record's failure is reported (the table queues it again); after the
  // backoff the next write goes through.
  store_.FailNext(1);
  persister_->Put(Request("job-2", loom::v1::RUNNING, 3));
  persister_->WaitIdle();
  std::vector<WriteResult> failed = results_.Take();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(failed[0].version, 3);
  EXPECT_EQ(failed[0].job, nullptr);
  EXPECT_TRUE(store_.jobs().empty());
  persister_->Put(Request("job-2", loom::v1::RUNNING, 3));
  persister_->WaitIdle();
  EXPECT_EQ(store_.jobs().size(), 1u);
  EXPECT_TRUE(fenced_.empty());
}

TEST_F(JobPersisterTest, AFencedWriteStopsItForGood) {
  Start();
  store_.FailNext(1, FencedError("job store: refused, this coordinator no longer leads"));
  persister_->Put(Request("job-1", loom::v1::RUNNING, 1));
  persister_->WaitIdle();
  {
    absl::MutexLock lock(&mu_);
    ASSERT_EQ(fenced_.size(), 1u);
    EXPECT_EQ(fenced_[0].code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(IsFenced(fenced_[0]));
  }
  EXPECT_TRUE(persister_->fenced());
  std::vector<WriteResult> results = results_.Take();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(IsFenced(results[0].status));
  // Nothing more is written; callers hear UNAVAILABLE at once.
  const int writes = store_.writes();
  persister_->Put(Request("job-1", loom::v1::FAILED, 2));
  absl::Status insert;
  persister_->Insert({Request("job-2", loom::v1::PENDING, 0).job},
                     [&](absl::Status s) { insert = s; });
  EXPECT_EQ(insert.code(), absl::StatusCode::kUnavailable);
  persister_->WaitIdle();
  EXPECT_EQ(store_.writes(), writes);
  EXPECT_TRUE(store_.jobs().empty());
}

TEST_F(JobPersisterTest, AStopWritesWhatWasQueuedThenRefuses) {
  Start();
  persister_->Put(Request("job-1", loom::v1::RUNNING, 1));
  persister_->Stop();
  EXPECT_EQ(store_.jobs().size(), 1u);
  absl::Status late;
  persister_->Delete({"job-1"}, [&](absl::Status s) { late = s; });
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store_.jobs().size(), 1u);
}

TEST_F(JobPersisterTest, StepChunksOfSeveralPutsAreAllWritten) {
  Start();
  store_.FailNext(1);  // hold the first write back so that both puts queue
  PersistRequest first = Request("job-1", loom::v1::RUNNING, 1);
  first.steps.chunks.push_back({.job_id = "job-1", .index = 0, .steps = {}});
  first.steps.chunks.back().steps.add_steps()->set_step(1);
  first.steps.through = 1;
  persister_->Put(std::move(first));
  persister_->WaitIdle();
  PersistRequest second = Request("job-1", loom::v1::RUNNING, 1);
  second.steps.chunks.push_back({.job_id = "job-1", .index = 1, .steps = {}});
  second.steps.chunks.back().steps.add_steps()->set_step(257);
  second.steps.through = 257;
  PersistRequest again = Request("job-1", loom::v1::RUNNING, 1);  // what the table re-queues
  again.steps.chunks.push_back({.job_id = "job-1", .index = 0, .steps = {}});
  again.steps.chunks.back().steps.add_steps()->set_step(1);
  persister_->Put(std::move(again));
  persister_->Put(std::move(second));
  persister_->WaitIdle();
  auto steps = store_.LoadSteps();
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->count("job-1"), 1u);
  EXPECT_EQ(steps->at("job-1").steps.size(), 2u);
  EXPECT_EQ(results_.Take().back().steps_through, 257);
}

}  // namespace
}  // namespace loom::coordinator
