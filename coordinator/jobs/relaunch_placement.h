// Where the failed ranks of an in-place recovery are relaunched (the rules are
// in docs/fault_tolerance.md, "In-place recovery"). Pure: part of
// in_place_policy.h, on its own because it is the one part that searches.
//
//  1. A failed rank goes back to its own node and device when that node is
//     live, not cordoned, and the device free (a crash, a hung culprit).
//  2. The others move, a TP group's moving ranks together on one node: to the
//     node of the rest of their TP group when part of it lives on (or, when
//     that node has no room, to another node of its NVLink domain: node
//     labels, docs/scheduling.md), else to a
//     node of the job's kind with room for them, preferring in turn a spare
//     node (no rank of the job), a node of the job, and last a node that
//     failed the job; within those, a node this relaunch already uses, then
//     the smallest that holds every rank still to move, then the largest.
//     Cordoned nodes take none. Devices are used in the order given.
//  3. No room: an error a user can read, and the whole job restarts.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "common/topology/placement.h"

namespace loom::coordinator {

// A live node of the job's device kind that could take a relaunched rank.
struct RelaunchNode {
  std::string node_id;
  // Local devices no other job holds, in the order to use them. The failed
  // attempt's own devices count as free here: the survivors' are kept out
  // from the placement (a failed rank's device is free once its process is
  // gone).
  std::vector<int64_t> free_devices;
  bool cordoned = false;  // takes no relaunched rank, not even in its old place
  // Its nvlink_domain label (empty: none): a TP group may span the nodes of
  // one domain.
  std::string nvlink_domain;
};

struct RelaunchPlacementRequest {
  int64_t tp = 1;
  const std::vector<topology::DeviceSlot>& placement;  // the failed attempt's
  const std::set<int64_t>& failed;                     // every rank to relaunch
  const std::set<std::string>& lost_nodes;
  const std::vector<RelaunchNode>& nodes;  // live nodes of the job's kind
  const std::set<std::string>& avoid;      // nodes that failed the job
};

struct RelaunchPlacement {
  std::vector<topology::DeviceSlot> slots;  // the next attempt's, index = global rank
  std::string error;                        // why some rank has no place; empty: ok
  bool ok() const { return error.empty(); }
};

RelaunchPlacement PlaceRelaunchedRanks(const RelaunchPlacementRequest& request);

}  // namespace loom::coordinator
