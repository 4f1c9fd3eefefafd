// The members of a rank's group in its assignment (loom.v1.GroupMembers):
// written as a list for small groups and as arithmetic runs for large ones,
// read back as a list. The coordinator writes, the trainer reads; both use
// this one encoding.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/v1/rank.pb.h"

namespace loom::proto {

// Groups larger than this are written as runs.
inline constexpr size_t kMaxListedMembers = 8;

// Fills group->ranks (small groups) or group->runs (larger ones).
void SetGroupMembers(const std::vector<int64_t>& ranks, loom::v1::GroupMembers* group);

// The members in group order, whichever form the group was written in.
std::vector<int> GroupMemberList(const loom::v1::GroupMembers& group);

}  // namespace loom::proto
