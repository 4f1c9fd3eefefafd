// Golden and property tests for the rank mesh: coordinates, groups, place strings.
#include "common/topology/mesh.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace loom::topology {
namespace {

using Groups = std::vector<std::vector<int64_t>>;

RankMesh Mesh(int64_t pp, int64_t dp, int64_t ep, int64_t cp, int64_t tp) {
  absl::StatusOr<RankMesh> m = RankMesh::Create({pp, dp, ep, cp, tp});
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

TEST(MeshTest, RejectsNonPositiveAxis) {
  absl::StatusOr<RankMesh> m = RankMesh::Create({1, 0, 1, 1, 1});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("dp=0"), std::string::npos) << m.status();
}

TEST(MeshTest, Tp2Dp2Pp2Golden) {
  RankMesh mesh = Mesh(/*pp=*/2, /*dp=*/2, 1, 1, /*tp=*/2);
  ASSERT_EQ(mesh.world_size(), 8);
  // rank = pp*4 + dp*2 + tp
  EXPECT_EQ(*mesh.CoordOf(5), (MeshCoord{.pp = 1, .dp = 0, .tp = 1}));
  EXPECT_EQ(*mesh.CoordOf(6), (MeshCoord{.pp = 1, .dp = 1, .tp = 0}));
  EXPECT_EQ(*mesh.RankOf({.pp = 0, .dp = 1, .tp = 1}), 3);
  EXPECT_EQ(mesh.AllGroups({Axis::kTp}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.AllGroups({Axis::kDp}), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.AllGroups({Axis::kPp}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.AllGroups({Axis::kTp, Axis::kPp}), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  RankGroups g = *mesh.GroupsOf(5);
  EXPECT_EQ(g.tp, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(g.dp, (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(g.pp, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(g.cp, (std::vector<int64_t>{5}));
  EXPECT_EQ(g.ep, (std::vector<int64_t>{5}));
  EXPECT_EQ(g.dp_cp, (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(g.model, (std::vector<int64_t>{0, 1, 4, 5}));
  EXPECT_EQ(*mesh.PlaceString(5), "TP(1)-CP(0)-PP(1)-DP(0)-Rank(5)");
  EXPECT_EQ(*mesh.PlaceString(2), "TP(0)-CP(0)-PP(0)-DP(1)-Rank(2)");
}

TEST(MeshTest, Tp4Cp2Golden) {
  RankMesh mesh = Mesh(1, 1, 1, /*cp=*/2, /*tp=*/4);
  EXPECT_EQ(*mesh.CoordOf(6), (MeshCoord{.cp = 1, .tp = 2}));
  EXPECT_EQ(mesh.AllGroups({Axis::kTp}), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(mesh.AllGroups({Axis::kCp}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  RankGroups g = *mesh.GroupsOf(6);
  EXPECT_EQ(g.dp_cp, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(g.tp_cp, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(g.dp, (std::vector<int64_t>{6}));
  EXPECT_EQ(*mesh.PlaceString(6), "TP(2)-CP(1)-PP(0)-DP(0)-Rank(6)");
}

TEST(MeshTest, Pp4Dp2Tp2Ep2Golden) {
  RankMesh mesh = Mesh(/*pp=*/4, /*dp=*/2, /*ep=*/2, 1, /*tp=*/2);
  ASSERT_EQ(mesh.world_size(), 32);
  // rank = pp*8 + dp*4 + ep*2 + tp
  EXPECT_EQ(*mesh.CoordOf(29), (MeshCoord{.pp = 3, .dp = 1, .ep = 0, .tp = 1}));
  EXPECT_EQ(*mesh.RankOf({.pp = 2, .dp = 0, .ep = 1, .tp = 0}), 18);
  RankGroups g = *mesh.GroupsOf(29);
  EXPECT_EQ(g.tp, (std::vector<int64_t>{28, 29}));
  EXPECT_EQ(g.ep, (std::vector<int64_t>{29, 31}));
  EXPECT_EQ(g.dp, (std::vector<int64_t>{25, 29}));
  EXPECT_EQ(g.pp, (std::vector<int64_t>{5, 13, 21, 29}));
  EXPECT_EQ(g.dp_cp, (std::vector<int64_t>{25, 29}));
  EXPECT_EQ(g.dp_ep_cp, (std::vector<int64_t>{25, 27, 29, 31}));
  EXPECT_EQ(g.model, (std::vector<int64_t>{4, 5, 12, 13, 20, 21, 28, 29}));
  EXPECT_EQ(*mesh.PlaceString(29), "TP(1)-CP(0)-EP(0)-PP(3)-DP(1)-Rank(29)");
  EXPECT_EQ(*mesh.PlaceString(18), "TP(0)-CP(0)-EP(1)-PP(2)-DP(0)-Rank(18)");
  EXPECT_EQ(mesh.AllGroups({Axis::kEp}).size(), 16u);
  EXPECT_EQ(mesh.AllGroups({Axis::kEp})[1], (std::vector<int64_t>{1, 3}));
}

TEST(MeshTest, OutOfRangeIsAnError) {
  RankMesh mesh = Mesh(2, 1, 1, 1, 2);
  EXPECT_FALSE(mesh.CoordOf(4).ok());
  EXPECT_FALSE(mesh.CoordOf(-1).ok());
  EXPECT_FALSE(mesh.RankOf({.pp = 2}).ok());
  EXPECT_FALSE(mesh.GroupOf(7, {Axis::kTp}).ok());
  EXPECT_FALSE(mesh.PlaceString(4).ok());
}

TEST(MeshTest, AxisSetNames) {
  EXPECT_EQ((AxisSet{Axis::kCp, Axis::kDp}).ToString(), "dp*cp");
  EXPECT_EQ(AxisSet().ToString(), "none");
  EXPECT_TRUE(AxisSet().With(Axis::kEp).Contains(Axis::kEp));
}

// Every shape with axes in {1, 2, 3} (world <= 36): coordinates round-trip in
// the documented order, and for every subset of axes the groups partition the
// world and agree from every member's point of view.
TEST(MeshTest, GroupsPartitionTheWorldForManyShapes) {
  int shapes = 0;
  for (int64_t pp = 1; pp <= 3; ++pp)
    for (int64_t dp = 1; dp <= 3; ++dp)
      for (int64_t ep = 1; ep <= 3; ++ep)
        for (int64_t cp = 1; cp <= 3; ++cp)
          for (int64_t tp = 1; tp <= 3; ++tp) {
            const MeshShape shape{pp, dp, ep, cp, tp};
            if (shape.world() > 36) continue;
            ++shapes;
            RankMesh mesh = Mesh(pp, dp, ep, cp, tp);
            for (int64_t r = 0; r < mesh.world_size(); ++r) {
              const MeshCoord c = *mesh.CoordOf(r);
              ASSERT_EQ((((c.pp * dp + c.dp) * ep + c.ep) * cp + c.cp) * tp + c.tp, r);
              ASSERT_EQ(*mesh.RankOf(c), r);
            }
            for (unsigned bits = 0; bits < 32; ++bits) {
              AxisSet axes;
              int64_t group_size = 1;
              for (Axis a : kAllAxes) {
                if (bits >> static_cast<int>(a) & 1u) {
                  axes = axes.With(a);
                  group_size *= AxisSize(shape, a);
                }
              }
              Groups all = mesh.AllGroups(axes);
              ASSERT_EQ(static_cast<int64_t>(all.size()) * group_size, mesh.world_size());
              std::vector<int> owner(mesh.world_size(), -1);
              for (size_t gi = 0; gi < all.size(); ++gi) {
                ASSERT_EQ(static_cast<int64_t>(all[gi].size()), group_size);
                ASSERT_TRUE(std::is_sorted(all[gi].begin(), all[gi].end()));
                for (int64_t m : all[gi]) {
                  ASSERT_EQ(owner[m], -1) << "rank " << m << " in two groups";
                  owner[m] = static_cast<int>(gi);
                }
              }
              for (int64_t r = 0; r < mesh.world_size(); ++r) {
                std::vector<int64_t> g = *mesh.GroupOf(r, axes);
                ASSERT_EQ(g, all[owner[r]]) << "rank " << r << " axes " << axes.ToString();
                const MeshCoord cr = *mesh.CoordOf(r);
                for (int64_t m : g) {
                  const MeshCoord cm = *mesh.CoordOf(m);
                  for (Axis a : kAllAxes) {
                    if (!axes.Contains(a)) {
                      ASSERT_EQ(cm.Get(a), cr.Get(a));
                    }
                  }
                }
              }
            }
            // Named groups equal the general function's.
            for (int64_t r = 0; r < mesh.world_size(); ++r) {
              RankGroups g = *mesh.GroupsOf(r);
              ASSERT_EQ(g.dp_cp, *mesh.GroupOf(r, {Axis::kDp, Axis::kCp}));
              ASSERT_EQ(g.dp_ep_cp, *mesh.GroupOf(r, {Axis::kDp, Axis::kEp, Axis::kCp}));
              ASSERT_EQ(g.pp[mesh.CoordOf(r)->pp], r);
              ASSERT_EQ(g.tp[mesh.CoordOf(r)->tp], r);
              ASSERT_EQ(g.tp.front() % tp, 0);  // TP groups are aligned runs
              ASSERT_EQ(g.tp.back() - g.tp.front() + 1, tp);
            }
          }
  EXPECT_GT(shapes, 100);
}

}  // namespace
}  // namespace loom::topology
