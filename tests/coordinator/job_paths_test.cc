// Submission-time confinement of a spec's paths, the job's checkpoint
// directory, and the per-state-directory job id prefix.
#include "coordinator/jobs/job_paths.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/common/scratch_dir.h"

namespace loom::coordinator {
namespace {

FileRoots Roots() { return {.data_roots = {"/srv/in", "/mnt/more"}, .checkpoint_root = "/ck"}; }

spec::JobSpec Spec(const std::string& train, const std::string& val = "") {
  spec::JobSpec s;
  s.data.train_path = train;
  s.data.val_path = val;
  s.checkpoint.dir = "checkpoints";
  return s;
}

TEST(ConfineSpecPaths, RelativeDataResolvesBeneathTheFirstRoot) {
  spec::JobSpec s = Spec("data/train.txt", "/mnt/more/val.txt");
  ASSERT_TRUE(ConfineSpecPaths(s, Roots()).ok());
  EXPECT_EQ(s.data.train_path, "/srv/in/data/train.txt");
  EXPECT_EQ(s.data.val_path, "/mnt/more/val.txt");
}

TEST(ConfineSpecPaths, EachBrokenRuleNamesItsField) {
  const std::pair<spec::JobSpec, std::string> cases[] = {
      {Spec("/etc/shadow"), "data.train_path"},
      {Spec("ok.txt", "../x"), "data.val_path"},
      {Spec(""), "data.train_path"},
  };
  for (const auto& [spec, field] : cases) {
    spec::JobSpec s = spec;
    absl::Status status = ConfineSpecPaths(s, Roots());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(status.message().find(field), std::string::npos) << status;
  }
  spec::JobSpec abs_ckpt = Spec("a");
  abs_ckpt.checkpoint.dir = "/other/job";
  EXPECT_NE(ConfineSpecPaths(abs_ckpt, Roots()).message().find("checkpoint.dir"),
            std::string::npos);
  spec::JobSpec from = Spec("a");
  from.checkpoint.resume_from = "../job-1";
  EXPECT_NE(ConfineSpecPaths(from, Roots()).message().find("checkpoint.resume_from"),
            std::string::npos);
}

TEST(CheckpointDirOf, OwnerAndJobUnderTheRoot) {
  spec::JobSpec s = Spec("a");
  EXPECT_EQ(*CheckpointDirOf(s, Roots(), "", "job-ab12cd-000001"), "/ck/default/job-ab12cd-000001");
  EXPECT_EQ(*CheckpointDirOf(s, Roots(), "alice", "job-1"), "/ck/alice/job-1");
  s.checkpoint.dir.clear();
  EXPECT_EQ(*CheckpointDirOf(s, Roots(), "alice", "job-1"), "");
}

TEST(JobIdPrefix, CreatedOnceAndKeptPerStateDirectory) {
  loom::testing::ScratchDir a("prefix_a"), b("prefix_b");
  absl::StatusOr<std::string> first = LoadOrCreateJobIdPrefix(a.path());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 6u);
  EXPECT_EQ(*LoadOrCreateJobIdPrefix(a.path()), *first);  // stable across restarts
  // Another state directory draws its own (a collision is 1 in 2^24).
  EXPECT_NE(*LoadOrCreateJobIdPrefix(b.path()), *first);
  std::ofstream(a.path() + "/job_id_prefix", std::ios::trunc) << "not-hex\n";
  EXPECT_FALSE(LoadOrCreateJobIdPrefix(a.path()).ok());
}

}  // namespace
}  // namespace loom::coordinator
