// Ranks as a user reads them, for messages and loomctl: ascending, runs
// written "4-7", at most eight items ("0, 2, 4-7, 9 and 3 more"). Shared by
// the coordinator's messages and loomctl through this header only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

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

}  // namespace loom
