// Who a rank runs as (worker/agent/rank_user.h): the job's own uid under
// --run_as_uid_range, checked against the range; the resume_from job's group
// added; --run_as_user or the agent's own user otherwise.
#include "worker/agent/rank_user.h"

#include <gtest/gtest.h>

namespace loom::agent {
namespace {

constexpr confine::UidRange kRange{200000, 299999};

loom::v1::RankAssignment Assignment(uint32_t uid, const std::string& from_job = "",
                                    uint32_t from_uid = 0) {
  loom::v1::RankAssignment a;
  a.set_job_id("job-1");
  a.set_run_uid(uid);
  a.set_resume_from_job(from_job);
  a.set_resume_from_uid(from_uid);
  return a;
}

TEST(RankUserTest, TheJobsOwnUidAndGidFromTheRange) {
  absl::StatusOr<RankUser> user = RankUserFor(Assignment(200007), kRange, {});
  ASSERT_TRUE(user.ok()) << user.status();
  EXPECT_EQ(user->owner.uid, 200007u);
  EXPECT_EQ(user->owner.gid, 200007u);
  EXPECT_TRUE(user->groups.empty());
  EXPECT_EQ(user->checkpoint_mode, 0750u);
}

TEST(RankUserTest, AUidOutsideTheRangeOrNoneIsRefused) {
  for (uint32_t bad : {0u, 199999u, 300000u}) {
    absl::StatusOr<RankUser> user = RankUserFor(Assignment(bad), kRange, {});
    ASSERT_FALSE(user.ok()) << bad;
    EXPECT_NE(user.status().message().find("assignment.run_uid"), std::string::npos);
  }
  // Under a range, --run_as_user's user is no fallback.
  EXPECT_FALSE(RankUserFor(Assignment(0), kRange, {.uid = 65534, .gid = 65534}).ok());
}

TEST(RankUserTest, AResumingJobGetsTheSourceJobsGroupOnly) {
  absl::StatusOr<RankUser> user = RankUserFor(Assignment(200009, "job-3", 200002), kRange, {});
  ASSERT_TRUE(user.ok()) << user.status();
  EXPECT_EQ(user->owner.uid, 200009u);
  EXPECT_EQ(user->groups, std::vector<gid_t>{200002});
  // A source uid outside the range would lend a foreign group: refused.
  absl::StatusOr<RankUser> foreign = RankUserFor(Assignment(200009, "job-3", 100), kRange, {});
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.status().message().find("assignment.resume_from_uid"), std::string::npos);
  // A source job from before uids (0) lends nothing; nor does a uid without a job.
  EXPECT_TRUE(RankUserFor(Assignment(200009, "job-3", 0), kRange, {})->groups.empty());
  EXPECT_TRUE(RankUserFor(Assignment(200009, "", 200002), kRange, {})->groups.empty());
}

TEST(RankUserTest, WithoutARangeTheRunAsUserOrTheAgentsOwn) {
  absl::StatusOr<RankUser> shared = RankUserFor(Assignment(200007), std::nullopt,
                                                {.uid = 65534, .gid = 65533});
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(shared->owner.uid, 65534u);
  EXPECT_EQ(shared->owner.gid, 65533u);
  EXPECT_EQ(shared->checkpoint_mode, 0700u);
  absl::StatusOr<RankUser> own = RankUserFor(Assignment(0), std::nullopt, {});
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->owner.uid, static_cast<uid_t>(-1));
  EXPECT_TRUE(own->groups.empty());
}

}  // namespace
}  // namespace loom::agent
