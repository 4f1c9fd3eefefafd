// BuildLayout: every rank's assignment agrees with the parts it is made of.
#include "common/topology/layout.h"

#include "gtest/gtest.h"

namespace loom::topology {
namespace {

LayoutRequest Request() {
  LayoutRequest r;
  r.shape = {.pp = 2, .dp = 2, .tp = 2};
  r.nodes = {{"node-a", 4, {}}, {"node-b", 4, {}}};
  r.num_layers = 8;
  r.end_costs = EndCosts{0.5, 0.5};
  r.schedule = ScheduleKind::k1F1B;
  r.microbatches = 4;
  return r;
}

TEST(LayoutTest, AssignsEveryRank) {
  absl::StatusOr<Layout> layout = BuildLayout(Request());
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->ranks.size(), 8u);
  EXPECT_DOUBLE_EQ(layout->bubble_fraction, 1.0 / 4.0);
  const RankAssignment& a = layout->ranks[5];
  EXPECT_EQ(a.rank, 5);
  EXPECT_EQ(a.place, "TP(1)-CP(0)-PP(1)-DP(0)-Rank(5)");
  EXPECT_EQ(a.stage, 1);
  EXPECT_EQ(a.device, (DeviceSlot{"node-b", 1}));
  EXPECT_EQ(a.groups.pp, (std::vector<int64_t>{1, 5}));
  ASSERT_EQ(a.chunks.size(), 1u);
  EXPECT_EQ(a.chunks[0].first_layer, 4);
  EXPECT_EQ(a.chunks[0].num_layers, 4);
  EXPECT_TRUE(a.chunks[0].has_lm_head);
  EXPECT_EQ(FormatInstructions(a.instructions).substr(0, 13), "rA0@0 F0 rA1@");
  for (const RankAssignment& r : layout->ranks) {
    EXPECT_EQ(r.instructions, layout->schedule.stages[r.coord.pp]);
    EXPECT_EQ(r.groups.pp[r.stage], r.rank);
    EXPECT_EQ(r.device, layout->placement.slots[r.rank]);
  }
}

TEST(LayoutTest, InterleavedChunksPerStage) {
  LayoutRequest r = Request();
  r.schedule = ScheduleKind::kInterleaved;
  r.virtual_stages = 2;
  absl::StatusOr<Layout> layout = BuildLayout(r);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const RankAssignment& a = layout->ranks[0];  // stage 0
  ASSERT_EQ(a.chunks.size(), 2u);
  EXPECT_EQ(a.chunks[0].virtual_stage, 0);
  EXPECT_EQ(a.chunks[1].virtual_stage, 2);
  EXPECT_DOUBLE_EQ(layout->bubble_fraction, 1.0 / 8.0);
}

TEST(LayoutTest, ReportsTheFailingPart) {
  LayoutRequest r = Request();
  r.num_layers = 1;
  EXPECT_NE(BuildLayout(r).status().message().find("num_layers=1"), std::string::npos);
  r = Request();
  r.nodes = {{"node-a", 4, {}}};
  EXPECT_EQ(BuildLayout(r).status().code(), absl::StatusCode::kResourceExhausted);
  r = Request();
  r.schedule = ScheduleKind::kInterleaved;
  r.virtual_stages = 2;
  r.microbatches = 3;
  EXPECT_NE(BuildLayout(r).status().message().find("multiple of pp=2"), std::string::npos);
}

}  // namespace
}  // namespace loom::topology
