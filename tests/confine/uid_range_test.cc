// Per-job uids (common/confine/uid_range.h): the range's text rules, the uid
// of each job sequence number (distinct, never past the range), and the
// agent's check of a uid it is sent.
#include "common/confine/uid_range.h"

#include <set>

#include <gtest/gtest.h>

namespace loom::confine {
namespace {

TEST(UidRangeTest, ParsesFirstAndLast) {
  absl::StatusOr<UidRange> range = ParseUidRange("200000-299999", "run_as_uid_range");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->first, 200000u);
  EXPECT_EQ(range->last, 299999u);
  EXPECT_EQ(range->size(), 100000u);
  EXPECT_EQ(FormatUidRange(*range), "200000-299999");
  EXPECT_TRUE(ParseUidRange("7-7", "f").ok());
  EXPECT_TRUE(ParseUidRange("1-4294967294", "f").ok());
}

TEST(UidRangeTest, RefusesRootReversedAndMalformedRanges) {
  for (const char* bad : {"0-10", "10-9", "1-4294967295", "", "100", "a-b", "-5-10", "5-",
                          "5 -10", "+5-10", "1-99999999999", "1-2-3"}) {
    absl::StatusOr<UidRange> range = ParseUidRange(bad, "job_uid_range");
    EXPECT_FALSE(range.ok()) << bad;
    EXPECT_NE(range.status().message().find("--job_uid_range"), std::string::npos) << bad;
  }
}

TEST(UidRangeTest, EachSequenceNumberGetsItsOwnUidInsideTheRange) {
  const UidRange range{1000, 1999};
  std::set<uid_t> seen;
  for (int64_t sequence = 1; sequence <= 1000; ++sequence) {
    absl::StatusOr<uid_t> uid = JobUid(range, sequence);
    ASSERT_TRUE(uid.ok()) << sequence << ": " << uid.status();
    EXPECT_TRUE(range.Contains(*uid));
    EXPECT_TRUE(seen.insert(*uid).second) << "uid " << *uid << " given twice";
  }
  EXPECT_EQ(*JobUid(range, 1), 1000u);
  EXPECT_EQ(*JobUid(range, 1000), 1999u);
}

TEST(UidRangeTest, ASpentRangeRefusesRatherThanGivingAUidAgain) {
  const UidRange range{1000, 1009};
  absl::StatusOr<uid_t> past = JobUid(range, 11);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(past.status().message().find("1000-1009"), std::string::npos);
  EXPECT_FALSE(JobUid(range, 0).ok());
  EXPECT_FALSE(JobUid(range, -3).ok());
  // The top of the uid space does not wrap around to root.
  const UidRange top{4294967290u, 4294967294u};
  EXPECT_EQ(*JobUid(top, 5), 4294967294u);
  EXPECT_FALSE(JobUid(top, 6).ok());
}

TEST(UidRangeTest, TheAgentRefusesZeroAndUidsOutsideItsRange) {
  const UidRange range{200000, 299999};
  EXPECT_TRUE(CheckJobUid(range, 200000, "assignment.run_uid").ok());
  EXPECT_TRUE(CheckJobUid(range, 299999, "assignment.run_uid").ok());
  for (uint64_t bad : {0ull, 1ull, 199999ull, 300000ull, 4294967295ull}) {
    absl::Status s = CheckJobUid(range, bad, "assignment.run_uid");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("assignment.run_uid"), std::string::npos);
    EXPECT_NE(s.message().find("200000-299999"), std::string::npos);
  }
}

}  // namespace
}  // namespace loom::confine
