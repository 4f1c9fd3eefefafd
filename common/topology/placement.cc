#include "common/topology/placement.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::topology {
namespace {

struct Candidate {
  size_t index;       // position in request.nodes
  int64_t capacity;   // usable devices: whole TP groups only
  bool avoided;
};

absl::Status ValidateNodes(const PlacementRequest& request) {
  std::set<std::string> ids;
  for (size_t i = 0; i < request.nodes.size(); ++i) {
    const NodeDevices& n = request.nodes[i];
    if (n.node_id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("nodes[", i, "].node_id must not be empty"));
    }
    if (!ids.insert(n.node_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("nodes[", i, "].node_id=", n.node_id, " appears twice"));
    }
    if (n.free_devices < 0) {
      return absl::InvalidArgumentError(absl::StrCat("node ", n.node_id, ": free_devices=",
                                                     n.free_devices, " must be >= 0"));
    }
    if (!n.device_ids.empty()) {
      if (static_cast<int64_t>(n.device_ids.size()) != n.free_devices) {
        return absl::InvalidArgumentError(
            absl::StrCat("node ", n.node_id, ": device_ids has ", n.device_ids.size(),
                         " entries but free_devices=", n.free_devices));
      }
      std::set<int64_t> unique(n.device_ids.begin(), n.device_ids.end());
      if (static_cast<int64_t>(unique.size()) != n.free_devices || *unique.begin() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node ", n.node_id, ": device_ids must be distinct non-negative indices"));
      }
    }
  }
  return absl::OkStatus();
}

// Fewest nodes from `pool` holding `need` devices: repeatedly take the
// largest node, except that once a single node can cover what remains, the
// smallest such node is taken (best fit, so big nodes stay free for big jobs).
// Both rules stop after the same number of nodes as pure largest-first.
std::vector<Candidate> PickFewest(std::vector<Candidate> pool, int64_t need) {
  std::stable_sort(pool.begin(), pool.end(), [](const Candidate& a, const Candidate& b) {
    return a.capacity > b.capacity;
  });
  std::vector<Candidate> picked;
  std::vector<bool> used(pool.size(), false);
  while (need > 0) {
    int best_fit = -1;
    for (size_t i = 0; i < pool.size(); ++i) {
      if (!used[i] && pool[i].capacity >= need &&
          (best_fit < 0 || pool[i].capacity < pool[best_fit].capacity)) {
        best_fit = static_cast<int>(i);
      }
    }
    int take = best_fit;
    if (take < 0) {
      for (size_t i = 0; i < pool.size(); ++i) {
        if (!used[i]) { take = static_cast<int>(i); break; }
      }
    }
    if (take < 0 || pool[take].capacity == 0) break;
    used[take] = true;
    picked.push_back(pool[take]);
    need -= pool[take].capacity;
  }
  return picked;
}

}  // namespace

absl::StatusOr<Placement> PlaceRanks(const PlacementRequest& request) {
  absl::StatusOr<RankMesh> mesh = RankMesh::Create(request.shape);
  if (!mesh.ok()) return mesh.status();
  if (absl::Status s = ValidateNodes(request); !s.ok()) return s;

  const int64_t world = mesh->world_size();
  const int64_t tp = request.shape.tp;
  std::vector<Candidate> preferred, avoided;
  int64_t total_usable = 0, total_free = 0;
  std::vector<std::string> rounded;
  for (size_t i = 0; i < request.nodes.size(); ++i) {
    const NodeDevices& n = request.nodes[i];
    const int64_t cap = (n.free_devices / tp) * tp;
    total_usable += cap;
    total_free += n.free_devices;
    if (cap != n.free_devices) {
      rounded.push_back(absl::StrCat(n.node_id, " has ", n.free_devices, " free, ", cap, " usable"));
    }
    if (cap == 0) continue;
    const bool avoid = request.avoid.count(n.node_id) > 0;
    (avoid ? avoided : preferred).push_back({i, cap, avoid});
  }
  if (total_usable < world) {
    std::string msg = absl::StrCat("cannot place ", world, " ranks (", request.shape.pp, " pp x ",
                                   request.shape.dp, " dp x ", request.shape.ep, " ep x ",
                                   request.shape.cp, " cp x ", tp, " tp): ", request.nodes.size(),
                                   " nodes have ", total_free, " free devices, ", total_usable,
                                   " usable");
    if (!rounded.empty()) {
      absl::StrAppend(&msg, "; a TP group of ", tp,
                      " ranks must stay on one node, so each node's free devices are rounded "
                      "down to a multiple of tp=", tp, " (", absl::StrJoin(rounded, "; "), ")");
    }
    return absl::ResourceExhaustedError(msg);
  }

  int64_t preferred_total = 0;
  for (const Candidate& c : preferred) preferred_total += c.capacity;
  std::vector<Candidate> chosen;
  if (preferred_total >= world) {
    chosen = PickFewest(preferred, world);
  } else {
    // Every preferred node is needed; fill the rest with as few avoided ones.
    chosen = PickFewest(preferred, preferred_total);
    std::vector<Candidate> extra = PickFewest(avoided, world - preferred_total);
    chosen.insert(chosen.end(), extra.begin(), extra.end());
  }

  Placement placement;
  placement.slots.reserve(world);
  int64_t next_rank = 0;
  for (const Candidate& c : chosen) {
    const NodeDevices& n = request.nodes[c.index];
    const int64_t count = std::min(c.capacity, world - next_rank);
    placement.nodes.push_back({n.node_id, next_rank, count});
    if (c.avoided) ++placement.avoided_nodes_used;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t device = n.device_ids.empty() ? i : n.device_ids[i];
      placement.slots.push_back({n.node_id, device});
    }
    next_rank += count;
  }
  return placement;
}

}  // namespace loom::topology
