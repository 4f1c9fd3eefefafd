// The file-system half of confinement: symlinks out of a root, fresh
// directories, new files that never follow a planted symlink.
#include "common/confine/path_resolve.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/common/scratch_dir.h"

namespace loom::confine {
namespace {

namespace fs = std::filesystem;

class PathResolveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(scratch_.path().empty());
    root_ = scratch_.path() + "/root";
    outside_ = scratch_.path() + "/outside";
    fs::create_directories(root_ + "/sub");
    fs::create_directories(outside_);
    std::ofstream(root_ + "/sub/in.txt") << "inside";
    std::ofstream(outside_ + "/secret.txt") << "SECRET-BYTES";
  }
  testing::ScratchDir scratch_{"confine"};
  std::string root_, outside_;
};

TEST_F(PathResolveTest, PlainFileBeneathTheRootResolves) {
  absl::StatusOr<std::string> r = ResolveBeneath(root_ + "/sub/in.txt", {root_}, "data.train_path");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, fs::canonical(root_ + "/sub/in.txt").string());
}

TEST_F(PathResolveTest, SymlinkLeavingTheRootIsRefusedWithoutItsBytes) {
  fs::create_symlink(outside_ + "/secret.txt", root_ + "/link.txt");
  fs::create_directory_symlink(outside_, root_ + "/dirlink");
  for (const std::string& p : {root_ + "/link.txt", root_ + "/dirlink/secret.txt"}) {
    absl::StatusOr<std::string> r = ResolveBeneath(p, {root_}, "data.train_path");
    ASSERT_FALSE(r.ok()) << p;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("outside the data roots"), std::string::npos);
    EXPECT_EQ(r.status().message().find("SECRET"), std::string::npos);
  }
  // A symlink that stays inside is fine.
  fs::create_symlink(root_ + "/sub/in.txt", root_ + "/inner.txt");
  EXPECT_TRUE(ResolveBeneath(root_ + "/inner.txt", {root_}, "f").ok());
}

TEST_F(PathResolveTest, MissingFileIsNotFound) {
  EXPECT_EQ(ResolveBeneath(root_ + "/nope", {root_}, "f").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(PathResolveTest, DirsAreMadeFresh0700AndNeverThroughSymlinks) {
  absl::StatusOr<std::string> made = MakeDirsBeneath(root_, {"jobs", "job-1", "rank_0"}, true);
  ASSERT_TRUE(made.ok()) << made.status();
  struct stat st;
  ASSERT_EQ(stat(made->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // The last one again: refused, it is never reused.
  EXPECT_EQ(MakeDirsBeneath(root_, {"jobs", "job-1", "rank_0"}, true).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(MakeDirsBeneath(root_, {"jobs", "job-1"}, false).ok());
  // A symlink planted on the way is not followed.
  fs::create_directory_symlink(outside_, root_ + "/jobs/job-2");
  EXPECT_FALSE(MakeDirsBeneath(root_, {"jobs", "job-2", "rank_0"}, true).ok());
  EXPECT_FALSE(fs::exists(outside_ + "/rank_0"));
  EXPECT_FALSE(MakeDirsBeneath(root_, {"..", "x"}, false).ok());
}

TEST_F(PathResolveTest, AHandedDirHasItsModeAndAnExistingOneMustBeTheOwners) {
  if (geteuid() != 0) GTEST_SKIP() << "handing directories to another uid needs root";
  const FileOwner job{3100004, 3100004};
  absl::StatusOr<std::string> made =
      MakeDirsBeneath(root_, {"alice", "job-4"}, /*fresh_last=*/false, job, 0750);
  ASSERT_TRUE(made.ok()) << made.status();
  struct stat st;
  ASSERT_EQ(stat(made->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  EXPECT_EQ(st.st_uid, 3100004u);
  EXPECT_EQ(st.st_gid, 3100004u);
  ASSERT_EQ(stat((root_ + "/alice").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0711u);  // passable, not listable
  EXPECT_EQ(st.st_uid, 0u);
  // Found again by its own uid (another node, a later attempt): fine.
  EXPECT_TRUE(MakeDirsBeneath(root_, {"alice", "job-4"}, false, job, 0750).ok());
  // Found by another uid: it is another job's, refused naming both.
  absl::StatusOr<std::string> other =
      MakeDirsBeneath(root_, {"alice", "job-4"}, false, FileOwner{3100005, 3100005}, 0750);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("belongs to uid 3100004, not to uid 3100005"),
            std::string::npos)
      << other.status();
}

TEST_F(PathResolveTest, NewFilesNeverFollowOrTruncate) {
  fs::create_symlink(outside_ + "/secret.txt", root_ + "/log.txt");
  EXPECT_FALSE(CreateNewFile(root_ + "/log.txt").ok());
  std::ifstream in(outside_ + "/secret.txt");
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "SECRET-BYTES");
  absl::StatusOr<int> fd = CreateNewFile(root_ + "/fresh.txt");
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  EXPECT_FALSE(CreateNewFile(root_ + "/fresh.txt").ok());
}

}  // namespace
}  // namespace loom::confine
