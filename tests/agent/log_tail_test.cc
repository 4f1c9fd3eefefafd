// ReadLogTail / TailLines / ReadLogBeneath: the last lines of a rank's log,
// and the one reader of rank-writable files, which follows no symlink, never
// blocks on a FIFO and reads a bounded number of bytes.
#include "worker/agent/log_tail.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"

namespace loom::agent {
namespace {

TEST(TailLinesTest, KeepsTheLastLines) {
  EXPECT_EQ(TailLines("a\nb\nc\n", 2, false), "b\nc");
  EXPECT_EQ(TailLines("a\nb\nc", 2, false), "b\nc");
  EXPECT_EQ(TailLines("a\nb\nc\n", 10, false), "a\nb\nc");
  EXPECT_EQ(TailLines("", 5, false), "");
  EXPECT_EQ(TailLines("a\n\nb\n", 5, false), "a\n\nb");
}

TEST(TailLinesTest, DropsALineCutAtTheStart) {
  EXPECT_EQ(TailLines("rtial\nwhole\n", 5, true), "whole");
  // The only line is kept even when cut: better half a message than none.
  EXPECT_EQ(TailLines("only-part", 5, true), "only-part");
}

TEST(ReadLogTailTest, ReadsTheEndOfALongFile) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/log.txt";
  {
    std::ofstream out(path);
    for (int i = 0; i < 1000; ++i) out << "line " << i << "\n";
  }
  std::string expected;
  for (int i = 980; i < 1000; ++i) absl::StrAppend(&expected, i > 980 ? "\n" : "", "line ", i);
  EXPECT_EQ(ReadLogTail(dir.path(), "log.txt", 20), expected);
  EXPECT_EQ(ReadLogTail(dir.path(), "log.txt", 2), "line 998\nline 999");
  // The last 20 bytes begin inside "line 997": that cut line is dropped.
  EXPECT_EQ(ReadLogTail(dir.path(), "log.txt", 20, 20), "line 998\nline 999");
  // A window that starts exactly at a line start keeps that line.
  EXPECT_EQ(ReadLogTail(dir.path(), "log.txt", 20, 18), "line 998\nline 999");
}

TEST(ReadLogTailTest, MissingOrEmptyFileGivesNothing) {
  testing::TempDir dir;
  EXPECT_EQ(ReadLogTail(dir.path(), "none.txt"), "");
  std::ofstream(dir.path() + "/empty.txt").close();
  EXPECT_EQ(ReadLogTail(dir.path(), "empty.txt"), "");
}

// What issue 29 found: a rank replaced its log with a symlink to the node's
// TLS key, and the failure reason carried the key.
TEST(ReadLogBeneathTest, RefusesASymlinkedLog) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/secret.key") << "SECRET KEY";
  std::filesystem::create_directories(dir.path() + "/jobs/j/attempt_1/rank_0");
  std::filesystem::create_symlink(dir.path() + "/secret.key",
                                  dir.path() + "/jobs/j/attempt_1/rank_0/log.txt");
  absl::StatusOr<LogRead> read = ReadLogBeneath(dir.path(), "jobs/j/attempt_1/rank_0/log.txt", 0, 1024);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
  EXPECT_NE(read.status().message().find("symbolic link"), std::string::npos) << read.status();
  const std::string tail = ReadLogTail(dir.path(), "jobs/j/attempt_1/rank_0/log.txt");
  EXPECT_EQ(tail.find("SECRET"), std::string::npos) << tail;
  EXPECT_NE(tail.find("not read"), std::string::npos) << tail;
}

// A directory on the way swapped for a symlink is refused too.
TEST(ReadLogBeneathTest, RefusesASymlinkedDirectory) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/elsewhere");
  std::ofstream(dir.path() + "/elsewhere/log.txt") << "SECRET";
  std::filesystem::create_directories(dir.path() + "/jobs/j/attempt_1");
  std::filesystem::create_directory_symlink(dir.path() + "/elsewhere",
                                            dir.path() + "/jobs/j/attempt_1/rank_0");
  absl::StatusOr<LogRead> read = ReadLogBeneath(dir.path(), "jobs/j/attempt_1/rank_0/log.txt", 0, 1024);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
}

// A FIFO in the log's place blocked an agent thread for good: now it is
// refused at once (O_NONBLOCK open, then fstat says it is no regular file).
TEST(ReadLogBeneathTest, RefusesAFifoWithoutBlocking) {
  testing::TempDir dir;
  ASSERT_EQ(mkfifo((dir.path() + "/log.txt").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<LogRead> read = ReadLogBeneath(dir.path(), "log.txt", 0, 1024);
  std::string tail = ReadLogTail(dir.path(), "log.txt");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
  EXPECT_NE(read.status().message().find("not a regular file"), std::string::npos);
  EXPECT_NE(tail.find("not read"), std::string::npos) << tail;
  // Not a timing assertion: a blocked open would never get here at all.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// A huge (sparse) log: only max_bytes are read, from the offset asked for or
// from the end.
TEST(ReadLogBeneathTest, ReadsBoundedBytesOfAHugeFile) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/log.txt";
  {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, int64_t{8} << 30), 0);  // 8 GiB, sparse
    const char end[] = "\nthe last line\n";
    ASSERT_EQ(pwrite(fd, end, sizeof(end) - 1, (int64_t{8} << 30)), static_cast<ssize_t>(sizeof(end) - 1));
    close(fd);
  }
  absl::StatusOr<LogRead> head = ReadLogBeneath(dir.path(), "log.txt", 0, 4096);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->data.size(), 4096u);
  EXPECT_EQ(head->offset, 0);
  absl::StatusOr<LogRead> end = ReadLogBeneath(dir.path(), "log.txt", -1, 64);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->data.size(), 64u);
  EXPECT_EQ(end->offset + 64, end->file_size);
  EXPECT_EQ(ReadLogTail(dir.path(), "log.txt", 1), "the last line");
  // Past the end: nothing, at the end.
  absl::StatusOr<LogRead> past = ReadLogBeneath(dir.path(), "log.txt", end->file_size + 10, 64);
  ASSERT_TRUE(past.ok());
  EXPECT_EQ(past->data, "");
  EXPECT_EQ(past->offset, end->file_size);
}

TEST(ReadLogBeneathTest, RefusesPathsThatLeaveTheRoot) {
  testing::TempDir dir;
  for (const char* bad : {"../log.txt", "a//log.txt", "./log.txt", "/etc/passwd", ""}) {
    absl::StatusOr<LogRead> read = ReadLogBeneath(dir.path(), bad, 0, 64);
    ASSERT_FALSE(read.ok()) << bad;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace loom::agent
