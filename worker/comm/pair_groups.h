// Groups of two ranks for point-to-point traffic that must never interleave
// with a job's collectives: the in-memory snapshot copies of in-place
// recovery (a rank to its buddy, a survivor to a relaunched rank;
// docs/fault_tolerance.md). Always Gloo over host memory, also on GPU jobs,
// each pair its own connection and queue.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace loom::comm {

inline constexpr char kPairAxis[] = "pair";

struct PairGroupOptions {
  std::string job_prefix;  // as CreateGroupCommunicator's ("" for a store namespaced per attempt)
  absl::Duration timeout = absl::Seconds(60);  // every transfer's bound
  std::string hostname = "127.0.0.1";          // the address this rank binds
  // The pairs' transport threads run at the lowest CPU priority
  // (background_priority.h), so the copies yield to training. Off by
  // default: measured, a node whose CPUs other work saturates starves such
  // copies (docs/fault_tolerance.md, "What a snapshot costs a step").
  bool background = false;
};

// One pair group per distinct peer (self and negative ranks are skipped),
// keyed by the peer's global rank; in each, the lower global rank is group
// rank 0. Blocks until every peer has joined. Every rank creates its pairs in
// the order of (lower, higher) global rank, one total order over all pairs,
// so the waits of different ranks cannot form a cycle.
absl::StatusOr<std::map<int, std::unique_ptr<Communicator>>> CreatePairGroups(
    Store& store, int my_rank, const std::vector<int>& peers, const PairGroupOptions& options);

// The other member's index in a pair group.
inline int PairPeerOf(const Communicator& pair) { return 1 - pair.rank(); }

}  // namespace loom::comm
