#include "proto/group_members.h"

namespace loom::proto {

void SetGroupMembers(const std::vector<int64_t>& ranks, loom::v1::GroupMembers* group) {
  group->clear_ranks();
  group->clear_runs();
  if (ranks.size() <= kMaxListedMembers) {
    for (int64_t r : ranks) group->add_ranks(static_cast<int32_t>(r));
    return;
  }
  // Greedy: extend the current run while the stride holds.
  size_t i = 0;
  while (i < ranks.size()) {
    loom::v1::RankRun* run = group->add_runs();
    run->set_first(static_cast<int32_t>(ranks[i]));
    if (i + 1 == ranks.size()) {
      run->set_count(1);
      break;
    }
    const int64_t stride = ranks[i + 1] - ranks[i];
    size_t j = i + 1;
    while (j + 1 < ranks.size() && ranks[j + 1] - ranks[j] == stride) ++j;
    run->set_stride(static_cast<int32_t>(stride));
    run->set_count(static_cast<int32_t>(j - i + 1));
    i = j + 1;
  }
}

std::vector<int> GroupMemberList(const loom::v1::GroupMembers& group) {
  std::vector<int> out(group.ranks().begin(), group.ranks().end());
  for (const loom::v1::RankRun& run : group.runs()) {
    for (int32_t k = 0; k < run.count(); ++k) out.push_back(run.first() + k * run.stride());
  }
  return out;
}

}  // namespace loom::proto
