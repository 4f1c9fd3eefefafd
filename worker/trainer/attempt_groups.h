// The communicators of one attempt of a rank: the training groups of its
// assignment (tp, dp, pp, cp, dp_cp, ep, created in that order on every rank
// so that no rendezvous waits on a rank still in another's) and then its
// snapshot pair groups (comm/pair_groups.h: its buddy, its ward, the peers a
// restore copy goes to or comes from). All of them belong to the attempt's
// CommunicatorSet, so an abort reaches every one; a new attempt builds new
// ones in its own store namespace and never reuses an aborted communicator.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/v1/rank.pb.h"
#include "worker/comm/collective_clock.h"
#include "worker/comm/communicator_set.h"
#include "worker/comm/pair_groups.h"
#include "worker/comm/stall_watch.h"
#include "worker/comm/store.h"

namespace loom::trainer {

struct AttemptGroups {
  // Null: an axis of one rank.
  comm::Communicator* tp = nullptr;
  comm::Communicator* dp = nullptr;
  comm::Communicator* pp = nullptr;
  comm::Communicator* cp = nullptr;
  comm::Communicator* dp_cp = nullptr;
  comm::Communicator* ep = nullptr;
  std::map<int, comm::Communicator*> pairs;  // by the peer's global rank
  // The training groups' collective times (timed_communicator.h); the pair
  // groups' snapshot copies run beside the steps and are not timed.
  std::shared_ptr<comm::CollectiveClock> clock;
  // Tells the clock when the process could not run (stall_watch.h).
  std::shared_ptr<comm::StallWatch> stall_watch;

  // The training groups, for the rank's health reports.
  std::vector<comm::Communicator*> training() const;
  comm::Communicator* pair(int peer) const;
};

// One training group of `axis` with `members` (global ranks, group order),
// over `store`: Gloo on CPU ranks, NCCL on GPU ranks.
using GroupFactory = std::function<absl::StatusOr<std::unique_ptr<comm::Communicator>>(
    comm::Store& store, const std::string& axis, const std::vector<int>& members)>;

// The members of the assignment's group of `axis`; INVALID_ARGUMENT naming
// the rank and the axis when it has none.
absl::StatusOr<std::vector<int>> AssignmentGroupMembers(const loom::v1::RankAssignment& a,
                                                        const std::string& axis);

// Builds the groups into `set` (which owns them; it may be aborted while
// they are being built, and then aborts each as it is added) and points
// `out` at them.
absl::Status BuildAttemptGroups(const loom::v1::RankAssignment& a, comm::Store& store,
                                const GroupFactory& make_group, const std::vector<int>& pair_peers,
                                const comm::PairGroupOptions& pair_options,
                                comm::CommunicatorSet& set, AttemptGroups* out);

}  // namespace loom::trainer
