#include "common/confine/uid_range.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/confine/path_rules.h"

namespace loom::confine {
namespace {

constexpr uint64_t kLargestUid = 4294967294ULL;  // (uid_t)-1 means "no change"

bool ParseDecimal(const std::string& text, uint64_t* value) {
  if (text.empty() || text.size() > 10) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(text, value);
}

}  // namespace

absl::StatusOr<UidRange> ParseUidRange(const std::string& text, const std::string& flag) {
  const size_t dash = text.find('-');
  uint64_t first = 0;
  uint64_t last = 0;
  if (dash == std::string::npos || !ParseDecimal(text.substr(0, dash), &first) ||
      !ParseDecimal(text.substr(dash + 1), &last)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "='", Printable(text.substr(0, 64)),
                                                   "' must be FIRST-LAST, two decimal uids"));
  }
  if (first < 1 || first > last || last > kLargestUid) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", first, "-", last, " must have 1 <= FIRST <= LAST <= ",
                     kLargestUid, " (uid 0 is root)"));
  }
  return UidRange{static_cast<uid_t>(first), static_cast<uid_t>(last)};
}

std::string FormatUidRange(const UidRange& range) {
  return absl::StrCat(range.first, "-", range.last);
}

absl::StatusOr<uid_t> JobUid(const UidRange& range, int64_t sequence) {
  if (sequence < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("job sequence number ", sequence, " must be at least 1"));
  }
  if (static_cast<uint64_t>(sequence) > range.size()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job uid range ", FormatUidRange(range), " is spent: job number ", sequence,
        " would get a uid past ", range.last,
        " and uids are never given twice (widen LAST of --job_uid_range and of every agent's "
        "--run_as_uid_range)"));
  }
  return static_cast<uid_t>(range.first + static_cast<uint64_t>(sequence) - 1);
}

absl::Status CheckJobUid(const UidRange& range, uint64_t uid, const std::string& field) {
  if (uid != 0 && range.Contains(uid)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, "=", uid, " is outside this node's --run_as_uid_range=", FormatUidRange(range),
      uid == 0 ? " (the coordinator gave the job no uid: give it --job_uid_range, the same range)"
               : " (give the coordinator and every agent the same range)"));
}

}  // namespace loom::confine
