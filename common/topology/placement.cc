#include "common/topology/placement.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::topology {
namespace {

struct Candidate {
  size_t index;       // position in the list PickFewest chooses from
  int64_t capacity;   // usable devices
  bool avoided;
};

// Nodes that may share a TP group: one NVLink domain's nodes, all preferred
// or all avoided, or a single node without a domain label.
struct Domain {
  std::string name;             // for messages
  std::string rack;             // its first node's
  std::vector<size_t> members;  // positions in request.nodes, in request order
  int64_t free = 0;
  int64_t capacity = 0;         // whole TP groups only
  bool avoided = false;
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

// Groups the nodes with free devices into domains, in order of first appearance.
std::vector<Domain> GroupDomains(const PlacementRequest& request) {
  std::vector<Domain> domains;
  std::map<std::pair<bool, std::string>, size_t> by_label;
  for (size_t i = 0; i < request.nodes.size(); ++i) {
    const NodeDevices& n = request.nodes[i];
    if (n.free_devices == 0) continue;
    const bool avoid = request.avoid.count(n.node_id) > 0;
    size_t at = domains.size();
    if (!n.nvlink_domain.empty()) {
      auto [it, added] = by_label.emplace(std::pair{avoid, n.nvlink_domain}, at);
      at = it->second;
      if (added) {
        Domain& d = domains.emplace_back();
        d.name = absl::StrCat("nvlink_domain ", n.nvlink_domain, avoid ? " (its avoided nodes)" : "");
        d.rack = n.rack;
        d.avoided = avoid;
      }
    } else {
      Domain& d = domains.emplace_back();
      d.name = n.node_id;
      d.rack = n.rack;
      d.avoided = avoid;
    }
    domains[at].members.push_back(i);
    domains[at].free += n.free_devices;
  }
  for (Domain& d : domains) d.capacity = (d.free / request.shape.tp) * request.shape.tp;
  return domains;
}

// The preferred domains to choose from: those of the smallest rack that holds
// `world` alone (a rack label's nodes; like a tree topology's best-fit leaf
// switch), or all of them when no rack does.
std::vector<Candidate> RackLocal(const std::vector<Candidate>& preferred,
                                 const std::vector<Domain>& domains, int64_t world) {
  std::map<std::string, int64_t> rack_capacity;
  std::vector<std::string> racks;  // first appearance
  for (const Candidate& c : preferred) {
    const std::string& rack = domains[c.index].rack;
    if (rack.empty()) continue;
    if (rack_capacity.emplace(rack, 0).second) racks.push_back(rack);
    rack_capacity[rack] += c.capacity;
  }
  const std::string* best = nullptr;
  for (const std::string& rack : racks) {
    const int64_t cap = rack_capacity[rack];
    if (cap >= world && (best == nullptr || cap < rack_capacity[*best])) best = &rack;
  }
  if (best == nullptr) return preferred;
  std::vector<Candidate> local;
  for (const Candidate& c : preferred) {
    if (domains[c.index].rack == *best) local.push_back(c);
  }
  return local;
}

// The chosen domains in rank order: rack by rack (each rack where its first
// domain was chosen), so consecutive ranks share a rack wherever they can.
void OrderByRack(std::vector<Candidate>& chosen, const std::vector<Domain>& domains) {
  std::map<std::string, size_t> rank_of_rack;
  for (const Candidate& c : chosen) rank_of_rack.emplace(domains[c.index].rack, rank_of_rack.size());
  std::stable_sort(chosen.begin(), chosen.end(), [&](const Candidate& a, const Candidate& b) {
    return rank_of_rack[domains[a.index].rack] < rank_of_rack[domains[b.index].rack];
  });
}

}  // namespace

absl::StatusOr<Placement> PlaceRanks(const PlacementRequest& request) {
  absl::StatusOr<RankMesh> mesh = RankMesh::Create(request.shape);
  if (!mesh.ok()) return mesh.status();
  if (absl::Status s = ValidateNodes(request); !s.ok()) return s;

  const int64_t world = mesh->world_size();
  const int64_t tp = request.shape.tp;
  const std::vector<Domain> domains = GroupDomains(request);
  std::vector<Candidate> preferred, avoided;
  int64_t total_usable = 0, total_free = 0;
  std::vector<std::string> rounded;
  for (size_t i = 0; i < domains.size(); ++i) {
    const Domain& d = domains[i];
    total_usable += d.capacity;
    total_free += d.free;
    if (d.capacity != d.free) {
      rounded.push_back(absl::StrCat(d.name, " has ", d.free, " free, ", d.capacity, " usable"));
    }
    if (d.capacity == 0) continue;
    (d.avoided ? avoided : preferred).push_back({i, d.capacity, d.avoided});
  }
  if (total_usable < world) {
    std::string msg = absl::StrCat("cannot place ", world, " ranks (", request.shape.pp, " pp x ",
                                   request.shape.dp, " dp x ", request.shape.ep, " ep x ",
                                   request.shape.cp, " cp x ", tp, " tp): ", request.nodes.size(),
                                   " nodes have ", total_free, " free devices, ", total_usable,
                                   " usable");
    if (!rounded.empty()) {
      absl::StrAppend(&msg, "; a TP group of ", tp,
                      " ranks must stay on one node (or one nvlink_domain), so each one's free "
                      "devices are rounded down to a multiple of tp=", tp, " (",
                      absl::StrJoin(rounded, "; "), ")");
    }
    return absl::ResourceExhaustedError(msg);
  }

  int64_t preferred_total = 0;
  for (const Candidate& c : preferred) preferred_total += c.capacity;
  std::vector<Candidate> chosen;
  if (preferred_total >= world) {
    chosen = PickFewest(RackLocal(preferred, domains, world), world);
  } else {
    // Every preferred domain is needed; fill the rest with as few avoided ones.
    chosen = PickFewest(preferred, preferred_total);
    std::vector<Candidate> extra = PickFewest(avoided, world - preferred_total);
    chosen.insert(chosen.end(), extra.begin(), extra.end());
  }
  OrderByRack(chosen, domains);

  Placement placement;
  placement.slots.reserve(world);
  int64_t next_rank = 0;
  for (const Candidate& c : chosen) {
    const Domain& d = domains[c.index];
    // A whole number of TP groups: capacities and the world are multiples of tp.
    int64_t left = std::min(c.capacity, world - next_rank);
    std::vector<Candidate> members;
    for (size_t m = 0; m < d.members.size(); ++m) {
      members.push_back({m, request.nodes[d.members[m]].free_devices, d.avoided});
    }
    for (const Candidate& m : PickFewest(members, left)) {
      const NodeDevices& n = request.nodes[d.members[m.index]];
      const int64_t count = std::min(m.capacity, left);
      placement.nodes.push_back({n.node_id, next_rank, count});
      if (d.avoided) ++placement.avoided_nodes_used;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t device = n.device_ids.empty() ? i : n.device_ids[i];
        placement.slots.push_back({n.node_id, device});
      }
      next_rank += count;
      left -= count;
    }
  }
  return placement;
}

}  // namespace loom::topology
