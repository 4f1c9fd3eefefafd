// Placement: contiguous packing in whole TP groups, fewest nodes, avoidance.
#include "common/topology/placement.h"

#include <map>
#include <set>

#include "gtest/gtest.h"

namespace loom::topology {
namespace {

std::vector<std::string> NodesUsed(const Placement& p) {
  std::vector<std::string> out;
  for (const NodeUse& n : p.nodes) out.push_back(n.node_id);
  return out;
}

TEST(PlacementTest, PacksContiguouslyNodeAfterNode) {
  absl::StatusOr<Placement> p =
      PlaceRanks({{.pp = 2, .dp = 2, .tp = 2}, {{"a", 4, {}}, {"b", 4, {}}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->slots.size(), 8u);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(p->slots[r], (DeviceSlot{r < 4 ? "a" : "b", r % 4})) << r;
  }
  ASSERT_EQ(p->nodes.size(), 2u);
  EXPECT_EQ(p->nodes[1].first_rank, 4);
  EXPECT_EQ(p->nodes[1].num_ranks, 4);
  EXPECT_EQ(p->avoided_nodes_used, 0);
}

TEST(PlacementTest, PrefersFewestNodesAndBestFit) {
  // 8 ranks fit on b alone.
  absl::StatusOr<Placement> p =
      PlaceRanks({{.dp = 8}, {{"a", 2, {}}, {"b", 8, {}}, {"c", 4, {}}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"b"}));
  // 4 ranks: the smallest node that holds them all, leaving the 8 free.
  p = PlaceRanks({{.dp = 4}, {{"a", 8, {}}, {"b", 6, {}}, {"c", 4, {}}, {"d", 4, {}}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"c"}));
  // 10 ranks: two nodes (8 + best fit for the remaining 2).
  p = PlaceRanks({{.dp = 10}, {{"a", 8, {}}, {"b", 6, {}}, {"c", 2, {}}, {"d", 4, {}}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(p->nodes[1].num_ranks, 2);
}

TEST(PlacementTest, AvoidsNodesWhenPossible) {
  absl::StatusOr<Placement> p =
      PlaceRanks({{.dp = 4}, {{"a", 4, {}}, {"b", 4, {}}}, {"a"}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"b"}));
  EXPECT_EQ(p->avoided_nodes_used, 0);
  // Not possible: the preferred node comes first, the avoided one fills in.
  p = PlaceRanks({{.dp = 8}, {{"a", 4, {}}, {"b", 4, {}}, {"c", 8, {}}}, {"a", "c"}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(p->avoided_nodes_used, 1);
}

TEST(PlacementTest, TpGroupsNeverCrossNodes) {
  // tp=4 on nodes with 6 free: 4 usable on each.
  absl::StatusOr<Placement> p =
      PlaceRanks({{.dp = 2, .tp = 4}, {{"a", 6, {}}, {"b", 6, {}}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"a", "b"}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(p->slots[r].node_id, r < 4 ? "a" : "b");
}

TEST(PlacementTest, ErrorsNameTheReason) {
  absl::StatusOr<Placement> p =
      PlaceRanks({{.tp = 4}, {{"a", 3, {}}, {"b", 3, {}}, {"c", 3, {}}}, {}});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("tp=4"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("a has 3 free, 0 usable"), std::string::npos) << p.status();

  p = PlaceRanks({{.dp = 8}, {{"a", 4, {}}, {"b", 3, {}}}, {}});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("7 free devices"), std::string::npos) << p.status();

  p = PlaceRanks({{.dp = 2}, {{"a", 4, {}}, {"a", 4, {}}}, {}});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  p = PlaceRanks({{.dp = 2}, {{"a", 2, {0}}}, {}});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  p = PlaceRanks({{.dp = 0}, {{"a", 2, {}}}, {}});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlacementTest, UsesTheGivenDeviceIds) {
  absl::StatusOr<Placement> p = PlaceRanks({{.dp = 3}, {{"a", 3, {5, 2, 7}}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->slots[0].local_device, 5);
  EXPECT_EQ(p->slots[1].local_device, 2);
  EXPECT_EQ(p->slots[2].local_device, 7);
}

// Many shapes on uneven nodes: every rank gets a distinct device, ranks on a
// node are contiguous and every TP group sits on one node.
TEST(PlacementTest, PropertiesOverManyShapes) {
  const std::vector<NodeDevices> nodes = {
      {"n0", 8, {}}, {"n1", 6, {}}, {"n2", 8, {}}, {"n3", 3, {}}, {"n4", 8, {}}, {"n5", 4, {}}};
  int placed = 0;
  for (int64_t tp : {1, 2, 4, 8})
    for (int64_t dp : {1, 2, 3, 4})
      for (int64_t pp : {1, 2, 4}) {
        const MeshShape shape{.pp = pp, .dp = dp, .tp = tp};
        absl::StatusOr<Placement> p = PlaceRanks({shape, nodes, {"n2"}});
        if (!p.ok()) {
          ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
          continue;
        }
        ++placed;
        ASSERT_EQ(static_cast<int64_t>(p->slots.size()), shape.world());
        std::set<std::pair<std::string, int64_t>> used;
        for (const DeviceSlot& s : p->slots) ASSERT_TRUE(used.insert({s.node_id, s.local_device}).second);
        for (int64_t r = 0; r < shape.world(); r += tp) {
          for (int64_t i = 1; i < tp; ++i) ASSERT_EQ(p->slots[r + i].node_id, p->slots[r].node_id);
        }
        int64_t next = 0;
        for (const NodeUse& n : p->nodes) {
          ASSERT_EQ(n.first_rank, next);
          ASSERT_EQ(n.num_ranks % tp, 0);
          next += n.num_ranks;
        }
        ASSERT_EQ(next, shape.world());
        // n2 is avoided: used only when the others cannot hold the world.
        int64_t others = 0;
        for (const NodeDevices& n : nodes) {
          if (n.node_id != "n2") others += (n.free_devices / tp) * tp;
        }
        ASSERT_EQ(p->avoided_nodes_used, others >= shape.world() ? 0 : 1);
      }
  EXPECT_GT(placed, 30);
}

}  // namespace
}  // namespace loom::topology
