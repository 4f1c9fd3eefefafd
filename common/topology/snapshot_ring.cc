#include "common/topology/snapshot_ring.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>

namespace loom::topology {

int64_t SnapshotRing::BuddyOf(int64_t rank) const {
  return rank >= 0 && rank < static_cast<int64_t>(buddy.size()) ? buddy[rank] : -1;
}

int64_t SnapshotRing::WardOf(int64_t rank) const {
  return rank >= 0 && rank < static_cast<int64_t>(ward.size()) ? ward[rank] : -1;
}

std::vector<int64_t> SnapshotRing::Unprotected() const {
  std::vector<int64_t> ranks;
  for (size_t r = 0; r < buddy.size(); ++r) {
    if (buddy[r] < 0) ranks.push_back(static_cast<int64_t>(r));
  }
  return ranks;
}

std::vector<int64_t> SnapshotRing::SameNode(const std::vector<DeviceSlot>& slots) const {
  std::vector<int64_t> ranks;
  for (size_t r = 0; r < buddy.size() && r < slots.size(); ++r) {
    const int64_t b = buddy[r];
    if (b >= 0 && b < static_cast<int64_t>(slots.size()) && slots[b].node_id == slots[r].node_id) {
      ranks.push_back(static_cast<int64_t>(r));
    }
  }
  return ranks;
}

namespace {

// Ranks (ascending) that no rank of another node can hold copies for: a ring
// of their own on their node; a lone one keeps -1.
void RingOnOwnNode(const std::vector<int64_t>& ranks, SnapshotRing& ring) {
  if (ranks.size() < 2) return;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int64_t to = ranks[(i + 1) % ranks.size()];
    ring.buddy[ranks[i]] = to;
    ring.ward[to] = ranks[i];
  }
}

}  // namespace

SnapshotRing BuildSnapshotRing(const std::vector<DeviceSlot>& slots) {
  const int64_t world = static_cast<int64_t>(slots.size());
  SnapshotRing ring;
  ring.buddy.assign(slots.size(), -1);
  ring.ward.assign(slots.size(), -1);
  // Ranks node by node, nodes in order of their first rank.
  std::map<std::string, size_t> node_index;
  std::vector<std::vector<int64_t>> nodes;
  for (int64_t r = 0; r < world; ++r) {
    auto [it, added] = node_index.emplace(slots[r].node_id, nodes.size());
    if (added) nodes.emplace_back();
    nodes[it->second].push_back(r);
  }
  if (nodes.size() < 2) {
    if (!nodes.empty()) RingOnOwnNode(nodes[0], ring);
    return ring;
  }
  size_t largest = 0;
  for (size_t n = 1; n < nodes.size(); ++n) {
    if (nodes[n].size() > nodes[largest].size()) largest = n;
  }
  const int64_t m = static_cast<int64_t>(nodes[largest].size());
  auto link = [&ring](int64_t from, int64_t to) {
    ring.buddy[from] = to;
    ring.ward[to] = from;
  };
  if (2 * m <= world) {
    std::vector<int64_t> order;
    order.reserve(slots.size());
    for (const auto& ranks : nodes) order.insert(order.end(), ranks.begin(), ranks.end());
    for (int64_t j = 0; j < world; ++j) link(order[j], order[(j + m) % world]);
    return ring;
  }
  // One node holds more than half: pair its first ranks with everyone else's.
  std::vector<int64_t> others;
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (n != largest) others.insert(others.end(), nodes[n].begin(), nodes[n].end());
  }
  for (size_t i = 0; i < others.size(); ++i) {
    link(nodes[largest][i], others[i]);
    link(others[i], nodes[largest][i]);
  }
  RingOnOwnNode({nodes[largest].begin() + static_cast<std::ptrdiff_t>(others.size()),
                 nodes[largest].end()},
                ring);
  return ring;
}

}  // namespace loom::topology
