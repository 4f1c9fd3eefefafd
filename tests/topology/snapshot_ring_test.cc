// The snapshot ring: a rank's buddy is the rank with the same local index on
// the next node; wards are the inverse; uneven nodes and a node holding more
// than half the ranks follow the written rule, and the ranks no other node
// can hold copies for (a one-node job, the surplus of a node holding more
// than half) form a ring on their own node.
#include "common/topology/snapshot_ring.h"

#include <map>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace loom::topology {
namespace {

// One slot per rank, node ids given per rank.
std::vector<DeviceSlot> Slots(const std::vector<std::string>& nodes) {
  std::vector<DeviceSlot> slots;
  std::map<std::string, int64_t> next_device;
  for (const std::string& node : nodes) slots.push_back({node, next_device[node]++});
  return slots;
}

// Blocks of ranks: {"a", 4}, {"b", 4} -> a a a a b b b b.
std::vector<DeviceSlot> Blocks(const std::vector<std::pair<std::string, int>>& blocks) {
  std::vector<std::string> nodes;
  for (const auto& [node, count] : blocks) nodes.insert(nodes.end(), count, node);
  return Slots(nodes);
}

// Every property the rule promises, for any placement.
void ExpectConsistent(const std::vector<DeviceSlot>& slots, const SnapshotRing& ring) {
  ASSERT_EQ(ring.buddy.size(), slots.size());
  ASSERT_EQ(ring.ward.size(), slots.size());
  std::map<std::string, int64_t> per_node;
  for (const DeviceSlot& s : slots) ++per_node[s.node_id];
  int64_t most = 0;
  for (const auto& [node, count] : per_node) most = std::max(most, count);
  const int64_t world = static_cast<int64_t>(slots.size());
  // Ranks no rank of another node can hold copies for: every rank of a
  // one-node job, else the surplus of a node holding more than half.
  const int64_t leftover = per_node.size() < 2 ? world : std::max<int64_t>(0, 2 * most - world);
  EXPECT_EQ(static_cast<int64_t>(ring.Unprotected().size()), leftover == 1 ? 1 : 0);
  EXPECT_EQ(static_cast<int64_t>(ring.SameNode(slots).size()), leftover >= 2 ? leftover : 0);
  for (int64_t r = 0; r < world; ++r) {
    const int64_t buddy = ring.buddy[r];
    if (buddy >= 0) {
      EXPECT_NE(buddy, r) << "rank " << r;
      EXPECT_EQ(ring.ward[buddy], r) << "rank " << r;
    }
    if (ring.ward[r] >= 0) {
      EXPECT_EQ(ring.buddy[ring.ward[r]], r) << "rank " << r;
    }
    // A rank holds copies exactly when it has a buddy: ward and buddy are -1 together.
    EXPECT_EQ(buddy < 0, ring.ward[r] < 0) << "rank " << r;
  }
}

TEST(SnapshotRingTest, TwoNodesPairTheSameLocalIndex) {
  const std::vector<DeviceSlot> slots = Blocks({{"a", 4}, {"b", 4}});
  const SnapshotRing ring = BuildSnapshotRing(slots);
  EXPECT_EQ(ring.buddy, (std::vector<int64_t>{4, 5, 6, 7, 0, 1, 2, 3}));
  EXPECT_EQ(ring.ward, (std::vector<int64_t>{4, 5, 6, 7, 0, 1, 2, 3}));
  ExpectConsistent(slots, ring);
}

TEST(SnapshotRingTest, FourNodesFormARingOverNodes) {
  const std::vector<DeviceSlot> slots = Blocks({{"a", 2}, {"b", 2}, {"c", 2}, {"d", 2}});
  const SnapshotRing ring = BuildSnapshotRing(slots);
  // Local index kept, next node, the last node wrapping to the first.
  EXPECT_EQ(ring.buddy, (std::vector<int64_t>{2, 3, 4, 5, 6, 7, 0, 1}));
  EXPECT_EQ(ring.ward, (std::vector<int64_t>{6, 7, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(ring.BuddyOf(7), 1);
  EXPECT_EQ(ring.WardOf(0), 6);
  EXPECT_EQ(ring.BuddyOf(8), -1);
  EXPECT_EQ(ring.BuddyOf(-1), -1);
  ExpectConsistent(slots, ring);
}

TEST(SnapshotRingTest, EveryRankOnOneNodeFormsARingOnIt) {
  const std::vector<DeviceSlot> slots = Blocks({{"a", 4}});
  const SnapshotRing ring = BuildSnapshotRing(slots);
  // The next rank on the node, the last wrapping to the first.
  EXPECT_EQ(ring.buddy, (std::vector<int64_t>{1, 2, 3, 0}));
  EXPECT_EQ(ring.ward, (std::vector<int64_t>{3, 0, 1, 2}));
  EXPECT_TRUE(ring.Unprotected().empty());
  EXPECT_EQ(ring.SameNode(slots), (std::vector<int64_t>{0, 1, 2, 3}));
  ExpectConsistent(slots, ring);
  // Two ranks are each other's buddies; one rank has none.
  EXPECT_EQ(BuildSnapshotRing(Blocks({{"a", 2}})).buddy, (std::vector<int64_t>{1, 0}));
  const std::vector<DeviceSlot> one = Blocks({{"a", 1}});
  EXPECT_EQ(BuildSnapshotRing(one).buddy, std::vector<int64_t>{-1});
  EXPECT_EQ(BuildSnapshotRing(one).Unprotected(), std::vector<int64_t>{0});
  EXPECT_TRUE(BuildSnapshotRing({}).buddy.empty());
}

TEST(SnapshotRingTest, NodesAreTakenInTheOrderOfTheirFirstRank) {
  // b holds ranks 0-1, a ranks 2-3: b is the first node of the ring.
  const std::vector<DeviceSlot> slots = Slots({"b", "b", "a", "a", "c", "c"});
  const SnapshotRing ring = BuildSnapshotRing(slots);
  EXPECT_EQ(ring.buddy, (std::vector<int64_t>{2, 3, 4, 5, 0, 1}));
  ExpectConsistent(slots, ring);
}

TEST(SnapshotRingTest, UnevenNodesShiftByTheLargestNode) {
  // 3 + 3 + 2: list 0 1 2 | 3 4 5 | 6 7, shifted by 3.
  const std::vector<DeviceSlot> slots = Blocks({{"a", 3}, {"b", 3}, {"c", 2}});
  const SnapshotRing ring = BuildSnapshotRing(slots);
  EXPECT_EQ(ring.buddy, (std::vector<int64_t>{3, 4, 5, 6, 7, 0, 1, 2}));
  ExpectConsistent(slots, ring);
  // A node holding exactly half still gets a buddy for every rank.
  const std::vector<DeviceSlot> half = Blocks({{"a", 4}, {"b", 2}, {"c", 2}});
  const SnapshotRing half_ring = BuildSnapshotRing(half);
  EXPECT_TRUE(half_ring.Unprotected().empty());
  ExpectConsistent(half, half_ring);
}

TEST(SnapshotRingTest, ANodeHoldingMoreThanHalfPairsWhatItCanAndRingsTheRestOnItself) {
  // 6 + 2: ranks 0, 1 of a pair with 6, 7 of b; 2-5 form a ring on a.
  const std::vector<DeviceSlot> slots = Blocks({{"a", 6}, {"b", 2}});
  const SnapshotRing ring = BuildSnapshotRing(slots);
  EXPECT_EQ(ring.buddy, (std::vector<int64_t>{6, 7, 3, 4, 5, 2, 0, 1}));
  EXPECT_EQ(ring.ward, (std::vector<int64_t>{6, 7, 5, 2, 3, 4, 0, 1}));
  EXPECT_TRUE(ring.Unprotected().empty());
  EXPECT_EQ(ring.SameNode(slots), (std::vector<int64_t>{2, 3, 4, 5}));
  ExpectConsistent(slots, ring);
  // 2 + 1: the one rank left over on a has no one to pair with.
  const std::vector<DeviceSlot> lone = Blocks({{"a", 2}, {"b", 1}});
  const SnapshotRing lone_ring = BuildSnapshotRing(lone);
  EXPECT_EQ(lone_ring.buddy, (std::vector<int64_t>{2, -1, 0}));
  EXPECT_EQ(lone_ring.Unprotected(), std::vector<int64_t>{1});
  ExpectConsistent(lone, lone_ring);
}

TEST(SnapshotRingTest, RandomPlacementsKeepEveryPromise) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int nodes = 1 + static_cast<int>(random() % 6);
    const int world = 1 + static_cast<int>(random() % 24);
    std::vector<std::string> placed;
    for (int r = 0; r < world; ++r) {
      // Sometimes in blocks (a placement), sometimes interleaved (ranks
      // relaunched elsewhere after an in-place recovery).
      const int node = trial % 2 == 0 ? r * nodes / world : static_cast<int>(random() % nodes);
      placed.push_back(absl::StrCat("n", node));
    }
    const std::vector<DeviceSlot> slots = Slots(placed);
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    ExpectConsistent(slots, BuildSnapshotRing(slots));
  }
}

TEST(SnapshotRingTest, SixteenThousandRanksOnEightRankNodes) {
  std::vector<std::pair<std::string, int>> blocks;
  for (int n = 0; n < 2048; ++n) blocks.emplace_back(absl::StrCat("node-", n), 8);
  const std::vector<DeviceSlot> slots = Blocks(blocks);
  const SnapshotRing ring = BuildSnapshotRing(slots);
  EXPECT_EQ(ring.BuddyOf(0), 8);
  EXPECT_EQ(ring.BuddyOf(16383), 7);  // the last node wraps to the first
  ExpectConsistent(slots, ring);
}

}  // namespace
}  // namespace loom::topology
