// Builds the communicator of one mesh group (tp, cp, ep, dp, pp, dp x cp...)
// from its member list, deriving the group's name and rendezvous keys from
// the members, so every member computes the same ones with no coordination.
//
// Create the groups in the same order on every rank (for example axis by
// axis): each creation blocks until all of the group's members have joined,
// and the same order everywhere keeps those waits from forming a cycle.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace loom::comm {

// How errors and counters name the group: "tp[0,1]"; past 8 members the
// middle is elided: "dp[0,8,16,...,504]".
std::string GroupDisplayName(const std::string& axis_name, const std::vector<int>& members);

// The rendezvous namespace: "<job_prefix>/<axis>/<m0,m1,...>", or for more
// than 16 members "<job_prefix>/<axis>/n<count>-<first>-<hash of the list>".
// An empty job_prefix (a store already namespaced per job attempt) is left out.
std::string GroupKeyPrefix(const std::string& job_prefix, const std::string& axis_name,
                           const std::vector<int>& members);

// members: the global ranks of the group in group-rank order (this rank's
// index in it becomes its rank in the group). A group of one gets a
// SelfCommunicator and touches no store. job_prefix must be unique per job
// attempt. Creating the same group twice in one attempt is allowed: a counter
// in the store gives each instance its own keys.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGroupCommunicator(
    Store& store, const std::string& job_prefix, const std::string& axis_name, const std::vector<int>& members,
    int my_global_rank, absl::Duration timeout, const std::string& hostname = "127.0.0.1",
    absl::Duration rendezvous_timeout = absl::ZeroDuration());

}  // namespace loom::comm
