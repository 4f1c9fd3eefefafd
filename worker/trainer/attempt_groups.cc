#include "worker/trainer/attempt_groups.h"

#include "absl/strings/str_cat.h"
#include "proto/group_members.h"
#include "worker/comm/timed_communicator.h"

namespace loom::trainer {

std::vector<comm::Communicator*> AttemptGroups::training() const {
  std::vector<comm::Communicator*> out;
  for (comm::Communicator* g : {tp, dp, pp, cp, dp_cp, ep}) {
    if (g != nullptr) out.push_back(g);
  }
  return out;
}

comm::Communicator* AttemptGroups::pair(int peer) const {
  auto it = pairs.find(peer);
  return it == pairs.end() ? nullptr : it->second;
}

absl::StatusOr<std::vector<int>> AssignmentGroupMembers(const loom::v1::RankAssignment& a,
                                                        const std::string& axis) {
  for (const auto& group : a.groups()) {
    if (group.axis() == axis) return proto::GroupMemberList(group);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("assignment of rank ", a.rank(), " has no ", axis, " group"));
}

absl::Status BuildAttemptGroups(const loom::v1::RankAssignment& a, comm::Store& store,
                                const GroupFactory& make_group, const std::vector<int>& pair_peers,
                                const comm::PairGroupOptions& pair_options,
                                comm::CommunicatorSet& set, AttemptGroups* out) {
  *out = AttemptGroups{};
  out->clock = std::make_shared<comm::CollectiveClock>();
  out->stall_watch = std::make_shared<comm::StallWatch>(
      [clock = out->clock](absl::Time from, absl::Time to) { clock->RecordStall(from, to); });
  auto group = [&](const std::string& axis, comm::Communicator** slot) -> absl::Status {
    absl::StatusOr<std::vector<int>> members = AssignmentGroupMembers(a, axis);
    if (!members.ok()) return members.status();
    if (members->size() <= 1) return absl::OkStatus();
    absl::StatusOr<std::unique_ptr<comm::Communicator>> made = make_group(store, axis, *members);
    if (!made.ok()) return made.status();
    if (*made == nullptr) return absl::OkStatus();
    *slot = set.Add(std::make_unique<comm::TimedCommunicator>(std::move(*made), out->clock));
    return absl::OkStatus();
  };
  for (auto [axis, slot] :
       {std::pair{"tp", &out->tp}, {"dp", &out->dp}, {"pp", &out->pp}, {"cp", &out->cp}}) {
    if (absl::Status s = group(axis, slot); !s.ok()) return s;
  }
  // [cp] The DP x CP group its gradients are reduced over exists only with CP.
  if (out->cp != nullptr) {
    if (absl::Status s = group("dp_cp", &out->dp_cp); !s.ok()) return s;
  }
  if (absl::Status s = group("ep", &out->ep); !s.ok()) return s;  // [ep] last
  absl::StatusOr<std::map<int, std::unique_ptr<comm::Communicator>>> pairs =
      comm::CreatePairGroups(store, a.rank(), pair_peers, pair_options);
  if (!pairs.ok()) return pairs.status();
  for (auto& [peer, communicator] : *pairs) out->pairs[peer] = set.Add(std::move(communicator));
  return absl::OkStatus();
}

}  // namespace loom::trainer
