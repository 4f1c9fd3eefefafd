// The job table (coordinator/jobs/job_table.h) over a persister and a store
// that fails on demand: a hard change's effects wait until it is stored,
// readers see the stored record, a caller's change that cannot be stored is
// put back and the caller hears UNAVAILABLE while anything else is written
// again, a fenced table lets its callers go and sends nothing more, and the
// invariants hold throughout.
#include "coordinator/jobs/job_table.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_job_store.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;
using loom::v1::JobState;

class JobTableTest : public ::testing::Test {
 protected:
  JobTableTest()
      : persister_(&store_, {.first_retry = absl::Milliseconds(1),
                             .max_retry = absl::Milliseconds(5)}),
        table_({.job_id_prefix = "abc"}, &persister_, &hub_) {
    persister_.Start([this](std::vector<WriteResult> r) { table_.OnWritten(std::move(r)); },
                     [this](const absl::Status& why) {
                       absl::MutexLock lock(&table_.mu());
                       for (auto& answer : table_.StopActingLocked(true, why)) answers_.push_back(answer);
                     });
  }
  ~JobTableTest() override { persister_.Stop(); }

  // A pending job, as admission inserts it.
  std::string Insert() {
    absl::MutexLock lock(&table_.mu());
    JobRecord record;
    record.job.set_id(table_.NewIdLocked(&record.sequence));
    record.job.set_state(JobState::PENDING);
    return table_.InsertLocked(std::move(record)).job.id();
  }

  testing::FakeJobStore store_;
  WatchHub hub_;
  JobPersister persister_;
  JobTable table_;
  std::vector<std::function<void()>> answers_;  // of callers a fence let go
};

TEST_F(JobTableTest, EffectsWaitForTheirChangeToBeStoredAndReadersSeeTheStoredRecord) {
  const std::string id = Insert();
  EXPECT_EQ(id, "job-abc-000001");
  store_.FailNext(1);  // the first write fails; the table writes it again
  std::vector<std::string> effects;
  {
    absl::MutexLock lock(&table_.mu());
    JobRecord& record = table_.AtLocked(id);
    table_.AfterStoredLocked(record, [&] { effects.push_back("before"); });  // nothing pending
    ASSERT_TRUE(table_.TransitionLocked(record, JobState::STARTING, "placed"));
    EXPECT_FALSE(table_.TransitionLocked(record, JobState::PENDING, "back"));  // illegal
    table_.AfterStoredLocked(record, [&] { effects.push_back("after"); });
    loom::v1::CoordinatorMessage kill;
    kill.mutable_kill()->set_job_id(id);
    table_.SendAfterStoredLocked(record, "node-a", kill);
    EXPECT_EQ(effects, std::vector<std::string>{"before"});
    EXPECT_TRUE(table_.OutboxEmptyLocked());
  }
  persister_.WaitIdle();
  EXPECT_EQ(table_.Get(id)->state(), JobState::STARTING);
  EXPECT_EQ(store_.jobs().at(id).state(), JobState::STARTING);
  absl::MutexLock lock(&table_.mu());
  EXPECT_EQ(effects, (std::vector<std::string>{"before", "after"}));
  auto outbox = table_.TakeOutboxLocked();
  ASSERT_EQ(outbox.size(), 1u);
  EXPECT_EQ(outbox[0].first, "node-a");
}

TEST_F(JobTableTest, AReaderDuringAFailingWriteSeesTheStoredRecord) {
  const std::string id = Insert();
  store_.FailNext(1000000);  // the store is down
  {
    absl::MutexLock lock(&table_.mu());
    ASSERT_TRUE(table_.TransitionLocked(table_.AtLocked(id), JobState::STARTING, "placed"));
    table_.AtLocked(id).job.mutable_last_progress()->set_step(7);  // live, soft
  }
  while (store_.writes() < 3) absl::SleepFor(absl::Milliseconds(1));  // retried
  auto job = table_.Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), JobState::PENDING);
  EXPECT_EQ(job->last_progress().step(), 7);
  auto page = table_.List(0, "", {});
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->jobs.at(0).state(), JobState::PENDING);
  store_.FailNext(0);
  persister_.WaitIdle();
  EXPECT_EQ(table_.Get(id)->state(), JobState::STARTING);
  EXPECT_TRUE(table_.CheckInvariants().ok()) << table_.CheckInvariants();
}

TEST_F(JobTableTest, ACallersChangeThatCannotBeStoredIsPutBack) {
  const std::string id = Insert();
  store_.FailNext(1, absl::InternalError("database is locked"));
  absl::Notification answered;
  absl::Status answer;
  bool sent_kill = false;
  {
    absl::MutexLock lock(&table_.mu());
    JobRecord& record = table_.AtLocked(id);
    const loom::v1::Job before = record.job;
    ASSERT_TRUE(table_.TransitionLocked(record, JobState::CANCELLED, "cancelled by the user"));
    table_.AfterStoredLocked(record, [&] { sent_kill = true; });
    table_.AwaitStoredLocked(
        record,
        [&](absl::Status s, std::shared_ptr<const loom::v1::Job>) {
          answer = s;
          answered.Notify();
        },
        [this, id, before]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          table_.AtLocked(id).job = before;
        });
  }
  answered.WaitForNotification();
  EXPECT_EQ(answer.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(answer.message()), HasSubstr("database is locked"));
  persister_.WaitIdle();
  EXPECT_FALSE(sent_kill);  // the effect of the change that failed never ran
  EXPECT_EQ(table_.Get(id)->state(), JobState::PENDING);
  EXPECT_EQ(store_.jobs().at(id).state(), JobState::PENDING);  // written again: as put back
  EXPECT_TRUE(table_.CheckInvariants().ok()) << table_.CheckInvariants();

  // The same change again, with the store well: the caller hears OK and the
  // stored record.
  absl::Notification stored;
  {
    absl::MutexLock lock(&table_.mu());
    JobRecord& record = table_.AtLocked(id);
    ASSERT_TRUE(table_.TransitionLocked(record, JobState::CANCELLED, "cancelled by the user"));
    table_.AwaitStoredLocked(
        record,
        [&](absl::Status s, std::shared_ptr<const loom::v1::Job> job) {
          EXPECT_TRUE(s.ok()) << s;
          EXPECT_EQ(job->state(), JobState::CANCELLED);
          stored.Notify();
        },
        nullptr);
  }
  stored.WaitForNotification();
  EXPECT_EQ(store_.jobs().at(id).state(), JobState::CANCELLED);
}

TEST_F(JobTableTest, AFencedTableLetsItsCallersGoAndSendsNothing) {
  const std::string id = Insert();
  store_.FailNext(1, FencedError("refused, this coordinator no longer leads"));
  absl::Notification answered;
  absl::Status answer;
  bool sent = false;
  {
    absl::MutexLock lock(&table_.mu());
    JobRecord& record = table_.AtLocked(id);
    ASSERT_TRUE(table_.TransitionLocked(record, JobState::CANCELLED, "cancelled"));
    table_.AfterStoredLocked(record, [&] { sent = true; });
    table_.AwaitStoredLocked(
        record,
        [&](absl::Status s, std::shared_ptr<const loom::v1::Job>) {
          answer = s;
          answered.Notify();
        },
        nullptr);
  }
  persister_.WaitIdle();
  for (auto& a : answers_) a();
  answered.WaitForNotification();
  EXPECT_EQ(answer.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsFenced(answer));
  EXPECT_FALSE(sent);
  absl::MutexLock lock(&table_.mu());
  EXPECT_FALSE(table_.ActingLocked());
  EXPECT_EQ(table_.NotActingLocked().code(), absl::StatusCode::kUnavailable);
  table_.SendLocked("node-a", loom::v1::CoordinatorMessage());
  EXPECT_TRUE(table_.OutboxEmptyLocked());
  EXPECT_TRUE(store_.jobs().empty());
}

TEST_F(JobTableTest, JobsArePagedInSequenceOrderAndForgotten) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(Insert());
  persister_.WaitIdle();
  auto first = table_.List(2, "", {});
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->jobs.size(), 2u);
  EXPECT_EQ(first->jobs[1].id(), ids[1]);
  auto second = table_.List(2, first->next_page_token, {});
  EXPECT_EQ(second->jobs[0].id(), ids[2]);
  {
    absl::MutexLock lock(&table_.mu());
    table_.ForgetLocked({ids[1], ids[3]});
    EXPECT_EQ(table_.OrderLocked().size(), 3u);
  }
  EXPECT_EQ(table_.Get(ids[1]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(table_.CheckInvariants().ok());
}

}  // namespace
}  // namespace loom::coordinator
