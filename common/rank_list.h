// Ranks as a user reads them, for messages and loomctl: ascending, runs
// written "4-7", at most eight items ("0, 2, 4-7, 9 and 3 more"); and as a
// user writes them (`loomctl trace --ranks=0,2-3`). Shared by the
// coordinator's messages and loomctl through this header only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace loom {

inline std::string RankList(std::vector<int64_t> ranks, int max_items = 8) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  int items = 0;
  size_t i = 0;
  while (i < ranks.size()) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (items == max_items) {
      absl::StrAppend(&out, " and ", ranks.size() - i, " more");
      break;
    }
    absl::StrAppend(&out, items > 0 ? ", " : "", ranks[i]);
    if (j > i) absl::StrAppend(&out, "-", ranks[j]);
    ++items;
    i = j + 1;
  }
  return out;
}

// "0,2-3" -> {0, 2, 3}: ranks and inclusive runs, comma-separated, each
// rank in [0, limit); ascending and without repeats. INVALID_ARGUMENT naming
// the item otherwise.
inline absl::StatusOr<std::vector<int>> ParseRankList(absl::string_view text, int limit = 1 << 20) {
  std::vector<int> out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> ends = absl::StrSplit(item, absl::MaxSplits('-', 1));
    int lo = 0;
    int hi = 0;
    const bool run = item.find('-') != absl::string_view::npos;
    if (!absl::SimpleAtoi(ends.first, &lo) || (run && !absl::SimpleAtoi(ends.second, &hi))) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", item, "' is not a rank or a run of ranks (like 0,2-3)"));
    }
    if (!run) hi = lo;
    if (lo < 0 || hi < lo || hi >= limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", item, "': ranks must be in [0, ", limit, ") and a run must go upwards"));
    }
    for (int r = lo; r <= hi; ++r) out.push_back(r);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace loom
