// Placement: which node and local device runs each global rank of a mesh.
//
// Ranks are packed contiguously, node after node, in whole TP groups (a TP
// group is tp consecutive ranks), so a TP group never spans two NVLink
// domains: without an nvlink_domain label a node is a domain of its own (a TP
// group stays inside one node); nodes sharing the label may together hold a
// TP group (node_labels.h). The domains are chosen to be as few as possible,
// skipping nodes in the `avoid` set (e.g. one that just failed a job) unless
// the others cannot hold the job; when one rack can hold the job it is placed
// in the smallest such rack, and the ranks run rack by rack in rank order, so
// pipeline neighbours and data-parallel replicas cross as few rack uplinks as
// the free devices allow (docs/topology.md, "Placement").
// Pure logic, no I/O.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/topology/mesh.h"

namespace loom::topology {

struct NodeDevices {
  std::string node_id;
  int64_t free_devices = 0;
  // Local indices of the free devices, used in this order. Empty means
  // 0..free_devices-1; otherwise its size must equal free_devices.
  std::vector<int64_t> device_ids;
  // Its labels (node_labels.h); empty: none.
  std::string nvlink_domain;
  std::string rack;
};

struct PlacementRequest {
  MeshShape shape;
  std::vector<NodeDevices> nodes;  // order breaks ties between equally good nodes
  std::set<std::string> avoid;     // node ids to use only as a last resort
};

struct DeviceSlot {
  std::string node_id;
  int64_t local_device = 0;
  bool operator==(const DeviceSlot&) const = default;
};

struct NodeUse {
  std::string node_id;
  int64_t first_rank = 0;  // the node runs ranks [first_rank, first_rank + num_ranks)
  int64_t num_ranks = 0;
};

struct Placement {
  std::vector<DeviceSlot> slots;  // index = global rank
  std::vector<NodeUse> nodes;     // in rank order
  int64_t avoided_nodes_used = 0; // nodes from `avoid` that could not be spared
};

// A domain can host floor(its free devices / tp) whole TP groups (one node
// without a domain label: floor(free_devices / tp)); devices left over by that
// rounding are not used. A domain's nodes in `avoid` form a domain of their
// own (used last), so a TP group never mixes avoided and preferred nodes.
// All or nothing: every rank is placed, or none. Fails (RESOURCE_EXHAUSTED,
// naming the shortfall and how tp rounded each node or domain down) when the
// nodes cannot hold the world, and (INVALID_ARGUMENT) on a malformed node
// list. Within a domain its nodes are used fewest first (largest first, best fit
// for the rest), each for a contiguous run of ranks.
absl::StatusOr<Placement> PlaceRanks(const PlacementRequest& request);

}  // namespace loom::topology
