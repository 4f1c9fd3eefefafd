// Admission (coordinator/jobs/job_admission.h) over the job table and a
// persister on a store that fails on demand: a job enters the table only once
// it is stored, a failed write reaches the caller as UNAVAILABLE naming the
// cause, the queue is bounded, and a stop answers what waits.
#include "coordinator/jobs/job_admission.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/job_planner.h"
#include "tests/coordinator/fake_job_store.h"
#include "tests/coordinator/job_manager_harness.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;

class JobAdmissionTest : public ::testing::Test {
 protected:
  JobAdmissionTest()
      : persister_(&store_),
        table_({}, &persister_, &hub_),
        metrics_(nullptr),
        lifecycle_({}, &table_, &hub_, &metrics_, &nodes_, &kv_) {
    persister_.Start([this](std::vector<WriteResult> r) { table_.OnWritten(std::move(r)); },
                     [](const absl::Status&) {});
  }
  ~JobAdmissionTest() override { persister_.Stop(); }

  std::unique_ptr<JobAdmission> Admission(int64_t max_queued = 16) {
    return std::make_unique<JobAdmission>(
        AdmissionOptions{.max_queued_submissions = max_queued,
                         .roots = {.data_roots = {"/data"}, .checkpoint_root = "/checkpoints"}},
        planner::ResolveLayout, &table_, &persister_, &lifecycle_);
  }
  absl::StatusOr<loom::v1::Job> Submit(JobAdmission& admission) {
    absl::Notification done;
    absl::StatusOr<loom::v1::Job> result;
    admission.SubmitAsync(testing::kSmallDpSpec, "job.yaml", "", "alice",
                          [&](absl::StatusOr<loom::v1::Job> job) {
                            result = std::move(job);
                            done.Notify();
                          });
    done.WaitForNotification();
    return result;
  }

  testing::FakeJobStore store_;
  WatchHub hub_;
  JobPersister persister_;
  JobTable table_;
  JobMetrics metrics_;
  NodeRegistry nodes_;
  KvStore kv_;
  JobLifecycle lifecycle_;
};

TEST_F(JobAdmissionTest, AJobEntersTheTableOnlyOnceStored) {
  auto admission = Admission();
  admission->Start();
  store_.FailNext(1, absl::InternalError("database or disk is full"));
  auto refused = Submit(*admission);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("database or disk is full"));
  EXPECT_TRUE(table_.List(0, "", {})->jobs.empty());
  auto admitted = Submit(*admission);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(admitted->id(), "job-000002");  // the refused one's id stays unused
  EXPECT_EQ(admitted->state(), loom::v1::PENDING);
  EXPECT_EQ(store_.jobs().count(admitted->id()), 1u);
  EXPECT_TRUE(table_.Get(admitted->id()).ok());
  EXPECT_EQ(store_.writers().count(std::this_thread::get_id()), 0u);
}

TEST_F(JobAdmissionTest, TheQueueIsBoundedAndAStopAnswersWhatWaits) {
  auto full = Admission(/*max_queued=*/0);
  auto refused = Submit(*full);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);

  auto stopping = Admission();  // not started: submissions wait
  absl::StatusOr<loom::v1::Job> waited;
  stopping->SubmitAsync(testing::kSmallDpSpec, "job.yaml", "", "alice",
                        [&](absl::StatusOr<loom::v1::Job> job) { waited = std::move(job); });
  stopping->Stop();
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(store_.jobs().empty());
}

}  // namespace
}  // namespace loom::coordinator
