// Placement: which node and local device runs each global rank of a mesh.
//
// Ranks are packed contiguously, node after node, in whole TP groups (a TP
// group is tp consecutive ranks), so a TP group never spans two nodes. The
// nodes are chosen to be as few as possible, skipping nodes in the `avoid`
// set (e.g. one that just failed a job) unless the others cannot hold the job.
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

// A node can host floor(free_devices / tp) whole TP groups; devices left over
// by that rounding are not used. Fails (RESOURCE_EXHAUSTED, naming the shortfall
// and how tp rounded each node down) when the nodes cannot hold the world, and
// (INVALID_ARGUMENT) on a malformed node list.
absl::StatusOr<Placement> PlaceRanks(const PlacementRequest& request);

}  // namespace loom::topology
