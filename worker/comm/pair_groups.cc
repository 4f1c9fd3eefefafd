#include "worker/comm/pair_groups.h"

#include <set>

#include "worker/comm/background_priority.h"
#include "worker/comm/group_factory.h"

namespace loom::comm {

namespace {

absl::StatusOr<std::map<int, std::unique_ptr<Communicator>>> CreatePairGroupsHere(
    Store& store, int my_rank, const std::vector<int>& peers, const PairGroupOptions& options) {
  // Ascending peers give ascending (lower, higher) pairs: the pairs with a
  // lower peer come first (lower = peer) in the peer's order, then those with
  // a higher one (lower = my_rank) in theirs.
  const std::set<int> sorted(peers.begin(), peers.end());
  std::map<int, std::unique_ptr<Communicator>> out;
  for (int peer : sorted) {
    if (peer < 0 || peer == my_rank) continue;
    const std::vector<int> members =
        peer < my_rank ? std::vector<int>{peer, my_rank} : std::vector<int>{my_rank, peer};
    absl::StatusOr<std::unique_ptr<Communicator>> group = CreateGroupCommunicator(
        store, options.job_prefix, kPairAxis, members, my_rank, options.timeout, options.hostname);
    if (!group.ok()) return group.status();
    out[peer] = std::move(*group);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::map<int, std::unique_ptr<Communicator>>> CreatePairGroups(
    Store& store, int my_rank, const std::vector<int>& peers, const PairGroupOptions& options) {
  if (!options.background) return CreatePairGroupsHere(store, my_rank, peers, options);
  // Each group's transport thread is started while it is created, and
  // inherits the creating thread's priority.
  return RunOnBackgroundThread(
      [&] { return CreatePairGroupsHere(store, my_rank, peers, options); });
}

}  // namespace loom::comm
