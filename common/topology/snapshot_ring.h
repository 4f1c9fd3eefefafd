// The snapshot ring of an attempt: for every rank its buddy, the rank on
// another node that holds a copy of its in-memory snapshots, and its ward, the
// rank whose copies it holds (docs/topology.md, "Snapshot ring";
// docs/fault_tolerance.md, "In-place recovery"). Pure, no I/O.
//
// The rule: list the ranks node by node (nodes in the order their first rank
// appears, each node's ranks ascending) and let m be the most ranks any one
// node holds. The buddy of the j-th rank of that list is the (j + m)-th,
// cyclically. When every node holds the same number of ranks this is the rank
// with the same local index on the next node, the last node wrapping to the
// first. A node's ranks are m or fewer consecutive entries of the cycle, so
// a shift by m leaves the node whenever m is at most half the world: a buddy
// is never on its rank's own node, and losing one node loses no snapshot.
//
// When one node holds more than half the ranks that cannot hold for all of
// them (each rank keeps one buddy and one ward): its first W - m ranks and
// the W - m ranks of the other nodes are paired as each other's buddies, in
// list order. Its remaining 2m - W ranks, and every rank of a job on one
// node, have no rank on another node left to hold their copies: they form a
// ring on their own node instead, each one's buddy the next of them in
// ascending order, the last wrapping to the first, so a crashed or hung rank
// among them is still recovered in place (losing that whole node then loses
// both copies, and the job restarts from disk). A lone such rank (2m - W = 1,
// or a job of one rank) has no buddy and no ward (-1).
#pragma once

#include <cstdint>
#include <vector>

#include "common/topology/placement.h"

namespace loom::topology {

struct SnapshotRing {
  std::vector<int64_t> buddy;  // index = global rank; -1: none
  std::vector<int64_t> ward;   // the inverse of buddy; -1: none

  int64_t BuddyOf(int64_t rank) const;  // -1 out of range
  int64_t WardOf(int64_t rank) const;
  // Ranks whose buddy is -1.
  std::vector<int64_t> Unprotected() const;
  // Ranks whose buddy is on their own node (given the placement they were
  // built from): losing that node loses both copies of their snapshots.
  std::vector<int64_t> SameNode(const std::vector<DeviceSlot>& slots) const;
};

// The ring over a placement (slots: index = global rank).
SnapshotRing BuildSnapshotRing(const std::vector<DeviceSlot>& slots);

}  // namespace loom::topology
