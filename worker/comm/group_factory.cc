#include "worker/comm/group_factory.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/self_communicator.h"

namespace loom::comm {
namespace {

constexpr size_t kMaxListedMembers = 8;
constexpr size_t kMaxKeyMembers = 16;

uint64_t Fnv1a(const std::vector<int>& members) {
  uint64_t hash = 1469598103934665603ull;
  for (int m : members) {
    for (int shift = 0; shift < 32; shift += 8) {
      hash ^= static_cast<uint64_t>((static_cast<uint32_t>(m) >> shift) & 0xff);
      hash *= 1099511628211ull;
    }
  }
  return hash;
}

}  // namespace

std::string GroupDisplayName(const std::string& axis_name, const std::vector<int>& members) {
  if (members.size() <= kMaxListedMembers) return absl::StrCat(axis_name, "[", absl::StrJoin(members, ","), "]");
  return absl::StrCat(axis_name, "[", members[0], ",", members[1], ",", members[2], ",...,", members.back(), "]");
}

std::string GroupKeyPrefix(const std::string& job_prefix, const std::string& axis_name,
                           const std::vector<int>& members) {
  // An empty job prefix (the store is already namespaced) adds no leading '/'.
  const std::string head = job_prefix.empty() ? axis_name : absl::StrCat(job_prefix, "/", axis_name);
  if (members.size() <= kMaxKeyMembers) return absl::StrCat(head, "/", absl::StrJoin(members, ","));
  return absl::StrCat(head, "/n", members.size(), "-", members[0], "-", absl::StrFormat("%016x", Fnv1a(members)));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateGroupCommunicator(
    Store& store, const std::string& job_prefix, const std::string& axis_name, const std::vector<int>& members,
    int my_global_rank, absl::Duration timeout, const std::string& hostname, absl::Duration rendezvous_timeout) {
  const std::string name = GroupDisplayName(axis_name, members);
  if (axis_name.empty()) return absl::InvalidArgumentError("group: axis_name must not be empty");
  if (members.empty()) return absl::InvalidArgumentError(absl::StrCat("group ", axis_name, ": no members"));
  if (std::set<int>(members.begin(), members.end()).size() != members.size()) {
    return absl::InvalidArgumentError(absl::StrCat("group ", name, ": a global rank appears twice in the members"));
  }
  const auto it = std::find(members.begin(), members.end(), my_global_rank);
  if (it == members.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", name, ": global rank ", my_global_rank, " is not one of its members"));
  }
  if (members.size() == 1) return std::unique_ptr<Communicator>(new SelfCommunicator(name));

  const std::string base = GroupKeyPrefix(job_prefix, axis_name, members);
  // The k-th creation of this group by each member gets counter values
  // k*n+1..(k+1)*n: nobody can start creation k+1 before all n have joined k.
  absl::StatusOr<int64_t> joined = store.Add(absl::StrCat(base, "/joined"), 1);
  if (!joined.ok()) {
    return absl::Status(joined.status().code(),
                        absl::StrCat("group ", name, ": rendezvous store: ", joined.status().message()));
  }
  const int64_t instance = (*joined - 1) / static_cast<int64_t>(members.size());

  GlooOptions options;
  options.group_name = name;
  options.rank = static_cast<int>(it - members.begin());
  options.size = static_cast<int>(members.size());
  options.key_prefix = absl::StrCat(base, "/", instance);
  options.timeout = timeout;
  options.rendezvous_timeout = rendezvous_timeout;
  options.hostname = hostname;
  return CreateGlooCommunicator(store, options);
}

}  // namespace loom::comm
