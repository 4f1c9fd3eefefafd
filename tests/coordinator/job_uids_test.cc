// Per-job uids at the coordinator (--job_uid_range, docs/security.md): each
// admitted job gets its own uid from its sequence number, sent in every
// rank's assignment with the resume_from job's; a spent range refuses new
// jobs, and neither deleting a job nor a restart gives its uid again.
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/job_manager_harness.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::kSmallDpSpec;

class JobUids : public testing::JobManagerHarness {
 protected:
  JobUids() : JobManagerHarness("loom_job_uids") {}
  void StartWithRange(uid_t first, uid_t last) {
    JobManagerOptions options;
    options.roots.job_uids = confine::UidRange{first, last};
    Start(options);
  }
};

std::string CheckpointSpec(const std::string& resume_from = "") {
  return absl::StrReplaceAll(
      kSmallDpSpec,
      {{"resources:", absl::StrCat("checkpoint: {dir: ck, interval: 5, keep: 2",
                                   resume_from.empty() ? "" : ", resume_from: " + resume_from,
                                   "}\nresources:")}});
}

TEST_F(JobUids, EachJobHasItsOwnUidInEveryAssignment) {
  StartWithRange(500000, 500009);
  auto node = AddNode("node-a", 4);
  auto first = jobs_->Submit(CheckpointSpec(), "job.yaml", "", "alice");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = jobs_->Submit(CheckpointSpec(first->id()), "job.yaml", "", "alice");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->run_uid(), 500000u);
  EXPECT_EQ(second->run_uid(), 500001u);
  EXPECT_EQ(first->resume_from_uid(), 0u);
  EXPECT_EQ(second->resume_from_uid(), 500000u);
  jobs_->WaitIdle();
  std::set<std::pair<std::string, uint32_t>> seen;
  for (const auto& m : node->messages()) {
    ASSERT_TRUE(m.has_launch());
    const loom::v1::RankAssignment& a = m.launch().assignment();
    seen.insert({a.job_id(), a.run_uid()});
    EXPECT_EQ(a.resume_from_uid(), a.job_id() == second->id() ? 500000u : 0u);
  }
  EXPECT_EQ(seen, (std::set<std::pair<std::string, uint32_t>>{{first->id(), 500000u},
                                                                {second->id(), 500001u}}));
}

TEST_F(JobUids, ASpentRangeRefusesAndNoUidIsGivenTwiceAfterDeleteOrRestart) {
  StartWithRange(600000, 600001);
  auto a = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  auto b = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "bob");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->run_uid(), b->run_uid());
  auto c = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("600000-600001 is spent"));
  // b's uid stays b's: deleted, restarted, the range still has none to give.
  ASSERT_TRUE(jobs_->Cancel(b->id()).ok());
  ASSERT_TRUE(jobs_->Delete(b->id()).ok());
  StartWithRange(600000, 600001);
  EXPECT_EQ(jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(jobs_->Get(a->id())->run_uid(), a->run_uid());  // stored with the job
  // A wider range continues after the sequence, never below it.
  StartWithRange(600000, 600009);
  auto d = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_GT(d->run_uid(), b->run_uid());
}

TEST_F(JobUids, WithoutARangeJobsHaveNoUid) {
  Start();
  auto a = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->run_uid(), 0u);
}

}  // namespace
}  // namespace loom::coordinator
