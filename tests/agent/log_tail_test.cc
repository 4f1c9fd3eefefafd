// ReadLogTail / TailLines: the last lines of a rank's log.
#include "worker/agent/log_tail.h"

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
  EXPECT_EQ(ReadLogTail(path, 20), expected);
  EXPECT_EQ(ReadLogTail(path, 2), "line 998\nline 999");
  // The last 20 bytes begin inside "line 997": that cut line is dropped.
  EXPECT_EQ(ReadLogTail(path, 20, 20), "line 998\nline 999");
  // A window that starts exactly at a line start keeps that line.
  EXPECT_EQ(ReadLogTail(path, 20, 18), "line 998\nline 999");
}

TEST(ReadLogTailTest, MissingOrEmptyFileGivesNothing) {
  testing::TempDir dir;
  EXPECT_EQ(ReadLogTail(dir.path() + "/none.txt"), "");
  std::ofstream(dir.path() + "/empty.txt").close();
  EXPECT_EQ(ReadLogTail(dir.path() + "/empty.txt"), "");
}

}  // namespace
}  // namespace loom::agent
