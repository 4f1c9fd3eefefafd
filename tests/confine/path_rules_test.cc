// The text rules of confinement: traversal, absolute paths, roots, empty
// values, NUL bytes, owner and job directory names.
#include "common/confine/path_rules.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::confine {
namespace {


const std::vector<std::string> kRoots = {"/srv/data", "/mnt/corpus"};

TEST(ConfineDataPath, RelativePathsResolveBeneathTheFirstRoot) {
  EXPECT_EQ(*ConfineDataPath("train.txt", kRoots, "data.train_path"), "/srv/data/train.txt");
  EXPECT_EQ(*ConfineDataPath("a/./b//c.bin", kRoots, "f"), "/srv/data/a/b/c.bin");
}

TEST(ConfineDataPath, AbsolutePathsOnlyInsideARoot) {
  EXPECT_EQ(*ConfineDataPath("/mnt/corpus/x/y.bin", kRoots, "f"), "/mnt/corpus/x/y.bin");
  EXPECT_EQ(*ConfineDataPath("/srv/data", kRoots, "f"), "/srv/data");
  for (const char* outside : {"/etc/shadow", "/srv/database/x", "/srv", "/", "/mnt/corpus2/a"}) {
    absl::StatusOr<std::string> r = ConfineDataPath(outside, kRoots, "data.train_path");
    ASSERT_FALSE(r.ok()) << outside;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("data.train_path"), std::string::npos);
    EXPECT_NE(r.status().message().find("outside the data roots"), std::string::npos);
  }
}

TEST(ConfineDataPath, DotDotNeverPasses) {
  for (const char* traversal : {"../x", "a/../../etc/passwd", "/srv/data/../data/x", "..",
                                "/srv/data/a/..", "a/.."}) {
    absl::StatusOr<std::string> r = ConfineDataPath(traversal, kRoots, "data.val_path");
    ASSERT_FALSE(r.ok()) << traversal;
    EXPECT_NE(r.status().message().find("'..'"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("data.val_path"), std::string::npos);
  }
  // A name that merely contains dots is a name.
  EXPECT_EQ(*ConfineDataPath("a..b/...", kRoots, "f"), "/srv/data/a..b/...");
}

TEST(ConfineDataPath, EmptyNulAndOverlongAreRefused) {
  EXPECT_FALSE(ConfineDataPath("", kRoots, "f").ok());
  const std::string nul("data\0/../../etc", 15);
  absl::StatusOr<std::string> r = ConfineDataPath(nul, kRoots, "f");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("NUL"), std::string::npos);
  EXPECT_EQ(r.status().message().find('\0'), std::string::npos);  // escaped in the message
  EXPECT_FALSE(ConfineDataPath(std::string(kMaxPathLength + 1, 'a'), kRoots, "f").ok());
  EXPECT_FALSE(ConfineDataPath("x", {}, "f").ok());
}

TEST(IsBeneath, WholeComponentsOnly) {
  EXPECT_TRUE(IsBeneath("/a/b", "/a"));
  EXPECT_TRUE(IsBeneath("/a", "/a"));
  EXPECT_FALSE(IsBeneath("/ab", "/a"));
  EXPECT_FALSE(IsBeneath("/", "/a"));
  EXPECT_TRUE(IsBeneath("/anything", "/"));
}

TEST(ParseRoots, CommaListMadeAbsoluteAndNormal) {
  absl::StatusOr<std::vector<std::string>> roots = ParseRoots("/x/,rel/dir,,/y/./z", "/cwd", "data_roots");
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_EQ(*roots, (std::vector<std::string>{"/x", "/cwd/rel/dir", "/y/z"}));
  EXPECT_FALSE(ParseRoots("", "/cwd", "data_roots").ok());
  EXPECT_FALSE(ParseRoots("/x/../etc", "/cwd", "data_roots").ok());
  EXPECT_EQ(*NormalizeRoot("/", "/cwd", "checkpoint_root"), "/");
}

TEST(CheckCheckpointName, OnlyARelativeName) {
  EXPECT_TRUE(CheckCheckpointName("", "checkpoint.dir").ok());
  EXPECT_TRUE(CheckCheckpointName("checkpoints", "checkpoint.dir").ok());
  EXPECT_TRUE(CheckCheckpointName("a/b", "checkpoint.dir").ok());
  for (const char* bad : {"/other/job", "../victim", "a/../../b"}) {
    absl::Status s = CheckCheckpointName(bad, "checkpoint.dir");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("checkpoint.dir"), std::string::npos);
  }
}

TEST(JobCheckpointDir, OwnerAndJobNeverBecomePaths) {
  EXPECT_EQ(*JobCheckpointDir("/ck", "", "job-1"), "/ck/default/job-1");
  EXPECT_EQ(*JobCheckpointDir("/ck", "alice", "job-1"), "/ck/alice/job-1");
  EXPECT_EQ(OwnerDirName(".."), "x-2e2e");
  EXPECT_EQ(OwnerDirName("a/b"), "x-612f62");
  EXPECT_EQ(OwnerDirName("CN=bob smith").rfind("x-", 0), 0u);
  EXPECT_FALSE(JobCheckpointDir("/ck", "alice", "../x").ok());
  EXPECT_FALSE(JobCheckpointDir("/ck", "alice", "").ok());
  EXPECT_FALSE(JobCheckpointDir("/ck", "alice", "a/b").ok());
}

}  // namespace
}  // namespace loom::confine
