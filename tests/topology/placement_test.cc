// Placement: contiguous packing in whole TP groups, fewest nodes, avoidance,
// NVLink domains and racks.
#include "common/topology/placement.h"

#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
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
      PlaceRanks({{.pp = 2, .dp = 2, .tp = 2}, {{"a", 4, {}, "", ""}, {"b", 4, {}, "", ""}}, {}});
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
      PlaceRanks({{.dp = 8}, {{"a", 2, {}, "", ""}, {"b", 8, {}, "", ""}, {"c", 4, {}, "", ""}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"b"}));
  // 4 ranks: the smallest node that holds them all, leaving the 8 free.
  p = PlaceRanks({{.dp = 4}, {{"a", 8, {}, "", ""}, {"b", 6, {}, "", ""}, {"c", 4, {}, "", ""}, {"d", 4, {}, "", ""}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"c"}));
  // 10 ranks: two nodes (8 + best fit for the remaining 2).
  p = PlaceRanks({{.dp = 10}, {{"a", 8, {}, "", ""}, {"b", 6, {}, "", ""}, {"c", 2, {}, "", ""}, {"d", 4, {}, "", ""}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(p->nodes[1].num_ranks, 2);
}

TEST(PlacementTest, AvoidsNodesWhenPossible) {
  absl::StatusOr<Placement> p =
      PlaceRanks({{.dp = 4}, {{"a", 4, {}, "", ""}, {"b", 4, {}, "", ""}}, {"a"}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"b"}));
  EXPECT_EQ(p->avoided_nodes_used, 0);
  // Not possible: the preferred node comes first, the avoided one fills in.
  p = PlaceRanks({{.dp = 8}, {{"a", 4, {}, "", ""}, {"b", 4, {}, "", ""}, {"c", 8, {}, "", ""}}, {"a", "c"}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(p->avoided_nodes_used, 1);
}

TEST(PlacementTest, TpGroupsNeverCrossNodes) {
  // tp=4 on nodes with 6 free: 4 usable on each.
  absl::StatusOr<Placement> p =
      PlaceRanks({{.dp = 2, .tp = 4}, {{"a", 6, {}, "", ""}, {"b", 6, {}, "", ""}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"a", "b"}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(p->slots[r].node_id, r < 4 ? "a" : "b");
}

TEST(PlacementTest, ErrorsNameTheReason) {
  absl::StatusOr<Placement> p =
      PlaceRanks({{.tp = 4}, {{"a", 3, {}, "", ""}, {"b", 3, {}, "", ""}, {"c", 3, {}, "", ""}}, {}});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("tp=4"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("a has 3 free, 0 usable"), std::string::npos) << p.status();

  p = PlaceRanks({{.dp = 8}, {{"a", 4, {}, "", ""}, {"b", 3, {}, "", ""}}, {}});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("7 free devices"), std::string::npos) << p.status();

  p = PlaceRanks({{.dp = 2}, {{"a", 4, {}, "", ""}, {"a", 4, {}, "", ""}}, {}});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  p = PlaceRanks({{.dp = 2}, {{"a", 2, {0}, "", ""}}, {}});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  p = PlaceRanks({{.dp = 0}, {{"a", 2, {}, "", ""}}, {}});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlacementTest, UsesTheGivenDeviceIds) {
  absl::StatusOr<Placement> p = PlaceRanks({{.dp = 3}, {{"a", 3, {5, 2, 7}, "", ""}}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->slots[0].local_device, 5);
  EXPECT_EQ(p->slots[1].local_device, 2);
  EXPECT_EQ(p->slots[2].local_device, 7);
}

// Many shapes on uneven nodes: every rank gets a distinct device, ranks on a
// node are contiguous and every TP group sits on one node.
TEST(PlacementTest, PropertiesOverManyShapes) {
  const std::vector<NodeDevices> nodes = {
      {"n0", 8, {}, "", ""}, {"n1", 6, {}, "", ""}, {"n2", 8, {}, "", ""}, {"n3", 3, {}, "", ""}, {"n4", 8, {}, "", ""}, {"n5", 4, {}, "", ""}};
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

NodeDevices Labeled(std::string id, int64_t free, std::string domain, std::string rack = "") {
  return {.node_id = std::move(id), .free_devices = free, .device_ids = {},
          .nvlink_domain = std::move(domain), .rack = std::move(rack)};
}

TEST(PlacementTest, NvlinkDomainHoldsTpGroupsAcrossItsNodes) {
  // tp=4 over nodes of 2 free devices: no node holds a TP group alone.
  const MeshShape shape{.dp = 2, .tp = 4};
  absl::StatusOr<Placement> p =
      PlaceRanks({shape, {{"a", 2, {}, "", ""}, {"b", 2, {}, "", ""}, {"c", 2, {}, "", ""}, {"d", 2, {}, "", ""}}, {}});
  ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("one node (or one nvlink_domain)"), std::string::npos)
      << p.status();
  // a+b and c+d are two domains of 4: each holds one TP group.
  p = PlaceRanks({shape,
                  {Labeled("a", 2, "d0"), Labeled("c", 2, "d1"), Labeled("b", 2, "d0"),
                   Labeled("d", 2, "d1")},
                  {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"a", "b", "c", "d"}));
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(p->slots[r].node_id == "a" || p->slots[r].node_id == "b");
  // Domains of 3 (2+1) each hold no TP group of 4: the shortfall names them.
  p = PlaceRanks({{.tp = 4}, {Labeled("a", 2, "d0"), Labeled("b", 1, "d0"), Labeled("c", 2, "d1"),
                              Labeled("d", 1, "d1")}, {}});
  ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("nvlink_domain d0 has 3 free, 0 usable"), std::string::npos)
      << p.status();
}

TEST(PlacementTest, DomainsAreChosenFewestFirstAndTheirNodesToo) {
  // d0 holds 8 of its 12 (4+4+4) with two nodes; d1 (2+2) is too small.
  absl::StatusOr<Placement> p =
      PlaceRanks({{.dp = 2, .tp = 4},
                  {Labeled("x", 2, "d1"), Labeled("a", 4, "d0"), Labeled("y", 2, "d1"),
                   Labeled("b", 4, "d0"), Labeled("c", 4, "d0")},
                  {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"a", "b"}));
}

TEST(PlacementTest, AvoidedNodesOfADomainAreUsedLast) {
  // b is avoided: its domain's preferred part (a, c) holds the job.
  absl::StatusOr<Placement> p = PlaceRanks(
      {{.tp = 4}, {Labeled("a", 2, "d0"), Labeled("b", 4, "d0"), Labeled("c", 2, "d0")}, {"b"}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(p->avoided_nodes_used, 0);
  // Now a alone is preferred and too small: b's part of the domain takes the job.
  p = PlaceRanks({{.tp = 4}, {Labeled("a", 2, "d0"), Labeled("b", 4, "d0")}, {"b"}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"b"}));
  EXPECT_EQ(p->avoided_nodes_used, 1);
}

TEST(PlacementTest, OneRackHoldsTheJobWhenItCan) {
  // Without racks: a then b (largest first, then best fit). r1 (a, c) holds 8.
  const std::vector<NodeDevices> plain = {{"a", 4, {}, "", ""}, {"b", 4, {}, "", ""}, {"c", 4, {}, "", ""}};
  absl::StatusOr<Placement> p = PlaceRanks({{.dp = 8}, plain, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"a", "b"}));
  p = PlaceRanks(
      {{.dp = 8}, {Labeled("a", 4, "", "r1"), Labeled("b", 4, "", "r2"), Labeled("c", 4, "", "r1")}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"a", "c"}));
  // Both racks hold 4 ranks: the smaller one (r2, 4 free) is chosen, leaving r1's 8.
  p = PlaceRanks(
      {{.dp = 4}, {Labeled("a", 4, "", "r1"), Labeled("c", 4, "", "r1"), Labeled("b", 4, "", "r2")}, {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"b"}));
}

TEST(PlacementTest, RanksRunRackByRack) {
  // No rack holds 12: all three nodes, r1's two first so ranks 0-7 share a rack.
  absl::StatusOr<Placement> p = PlaceRanks(
      {{.pp = 3, .dp = 4},
       {Labeled("a", 4, "", "r1"), Labeled("b", 4, "", "r2"), Labeled("c", 4, "", "r1")},
       {}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodesUsed(*p), (std::vector<std::string>{"a", "c", "b"}));
  EXPECT_EQ(p->nodes[2].first_rank, 8);
}

// Random clusters with domains, racks and avoided nodes: all or nothing, every
// rank on a distinct device, every TP group inside one domain (one node when
// unlabeled), nodes used for contiguous rank runs, and a placement whenever
// the domains' whole TP groups add up to the world.
TEST(PlacementTest, DomainPropertiesOverRandomClusters) {
  std::mt19937 random(27);
  int placed = 0, refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<NodeDevices> nodes;
    std::set<std::string> avoid;
    const int count = 1 + static_cast<int>(random() % 10);
    for (int i = 0; i < count; ++i) {
      const std::string id = absl::StrCat("n", i);
      const int64_t domain = random() % 4;  // 0: no label
      nodes.push_back(Labeled(id, random() % 9, domain == 0 ? "" : absl::StrCat("d", domain),
                              absl::StrCat("r", random() % 3)));
      if (random() % 6 == 0) avoid.insert(id);
    }
    const int64_t tps[] = {1, 2, 4, 8};
    const MeshShape shape{.pp = 1 + static_cast<int64_t>(random() % 3),
                          .dp = 1 + static_cast<int64_t>(random() % 4),
                          .tp = tps[random() % 4]};
    std::map<std::string, const NodeDevices*> by_id;
    for (const NodeDevices& n : nodes) by_id[n.node_id] = &n;
    // Whole TP groups per domain, a domain's avoided nodes apart.
    std::map<std::string, int64_t> domain_free;
    for (const NodeDevices& n : nodes) {
      const std::string key = n.nvlink_domain.empty()
                                  ? "node:" + n.node_id
                                  : absl::StrCat(avoid.count(n.node_id), ":", n.nvlink_domain);
      domain_free[key] += n.free_devices;
    }
    int64_t usable = 0;
    for (const auto& [key, free] : domain_free) usable += free / shape.tp * shape.tp;

    absl::StatusOr<Placement> p = PlaceRanks({shape, nodes, avoid});
    if (!p.ok()) {
      ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
      ASSERT_LT(usable, shape.world());
      ++refused;
      continue;
    }
    ++placed;
    ASSERT_GE(usable, shape.world());
    ASSERT_EQ(static_cast<int64_t>(p->slots.size()), shape.world());
    std::map<std::string, int64_t> per_node;
    std::set<std::pair<std::string, int64_t>> used;
    for (const DeviceSlot& s : p->slots) {
      ASSERT_TRUE(used.insert({s.node_id, s.local_device}).second);
      ASSERT_LT(s.local_device, by_id[s.node_id]->free_devices);
      ++per_node[s.node_id];
    }
    for (int64_t r = 0; r < shape.world(); r += shape.tp) {
      const NodeDevices* first = by_id[p->slots[r].node_id];
      for (int64_t i = 1; i < shape.tp; ++i) {
        const NodeDevices* other = by_id[p->slots[r + i].node_id];
        if (first->nvlink_domain.empty()) {
          ASSERT_EQ(other->node_id, first->node_id) << "rank " << r + i;
        } else {
          ASSERT_EQ(other->nvlink_domain, first->nvlink_domain) << "rank " << r + i;
          ASSERT_EQ(avoid.count(other->node_id), avoid.count(first->node_id)) << "rank " << r + i;
        }
      }
    }
    int64_t next = 0;
    for (const NodeUse& n : p->nodes) {
      ASSERT_EQ(n.first_rank, next);
      ASSERT_EQ(per_node[n.node_id], n.num_ranks);  // one contiguous run per node
      next += n.num_ranks;
    }
    ASSERT_EQ(next, shape.world());
  }
  EXPECT_GT(placed, 50);
  EXPECT_GT(refused, 50);
}

}  // namespace
}  // namespace loom::topology
