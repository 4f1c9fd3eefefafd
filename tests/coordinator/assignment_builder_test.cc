// Rank assignments: every rank gets its coordinates, groups, node and device,
// and the attempt's rendezvous namespace.
#include "coordinator/jobs/assignment_builder.h"

#include "common/spec/job_spec_rules.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

spec::JobSpec Spec(int64_t dp, int64_t tp, int64_t pp) {
  spec::JobSpec s;
  s.name = "t";
  s.model.num_layers = 4;
  s.parallelism.dp = dp;
  s.parallelism.tp = tp;
  s.parallelism.pp = pp;
  s.resources.ranks = dp * tp * pp;
  spec::FillTrivialLayout(s);
  return s;
}

const loom::v1::GroupMembers& Group(const loom::v1::RankAssignment& a, const std::string& axis) {
  for (const auto& g : a.groups()) {
    if (g.axis() == axis) return g;
  }
  static loom::v1::GroupMembers none;
  ADD_FAILURE() << "no group " << axis;
  return none;
}

TEST(AssignmentBuilder, Dp2Tp2Pp2OnTwoNodes) {
  spec::JobSpec s = Spec(2, 2, 2);
  topology::PlacementRequest request{.shape = spec::LayoutOf(s),
                                     .nodes = {{.node_id = "a", .free_devices = 4, .device_ids = {}},
                                               {.node_id = "b", .free_devices = 4, .device_ids = {}}},
                                     .avoid = {}};
  auto placement = topology::PlaceRanks(request);
  ASSERT_TRUE(placement.ok()) << placement.status();
  AttemptContext context{.job_id = "job-000007", .attempt = 3, .resolved_spec_yaml = "y",
                         .checkpoint_dir = "/ck", .data_dir = "/d", .collective_timeout_s = 9};
  auto assignments = BuildAssignments(s, *placement, context, {{"a", "10.0.0.1"}});
  ASSERT_TRUE(assignments.ok()) << assignments.status();
  ASSERT_EQ(assignments->size(), 8u);
  const auto& r5 = (*assignments)[5];
  EXPECT_EQ(r5.rank(), 5);
  EXPECT_EQ(r5.world_size(), 8);
  // rank 5 = pp 1, dp 0, tp 1 (tp fastest).
  EXPECT_EQ(r5.coords().pp(), 1);
  EXPECT_EQ(r5.coords().dp(), 0);
  EXPECT_EQ(r5.coords().tp(), 1);
  EXPECT_EQ(r5.place(), "TP(1)-CP(0)-PP(1)-DP(0)-Rank(5)");
  EXPECT_EQ(r5.node_id(), "b");
  EXPECT_EQ(r5.local_device(), 1);
  EXPECT_EQ(r5.node_address(), "127.0.0.1");  // b announced no address
  EXPECT_EQ((*assignments)[0].node_address(), "10.0.0.1");
  EXPECT_EQ(r5.store_namespace(), "job-000007/attempt-3");
  EXPECT_EQ(r5.layout().grad_accum_steps(), s.train.global_batch_size / (2 * s.train.micro_batch_size));
  const auto& tp = Group(r5, "tp");
  EXPECT_EQ(std::vector<int>(tp.ranks().begin(), tp.ranks().end()), (std::vector<int>{4, 5}));
  const auto& dp = Group(r5, "dp");
  EXPECT_EQ(std::vector<int>(dp.ranks().begin(), dp.ranks().end()), (std::vector<int>{5, 7}));
  const auto& pp = Group(r5, "pp");
  EXPECT_EQ(std::vector<int>(pp.ranks().begin(), pp.ranks().end()), (std::vector<int>{1, 5}));
  EXPECT_EQ(r5.checkpoint_dir(), "/ck");
  EXPECT_DOUBLE_EQ(r5.collective_timeout_s(), 9);
}

TEST(AssignmentBuilder, PipelineStagesGetTheirLayersAndInstructions) {
  spec::JobSpec s = Spec(1, 1, 2);
  s.train.global_batch_size = 8;
  s.train.micro_batch_size = 2;  // 4 micro-batches
  topology::PlacementRequest request{.shape = spec::LayoutOf(s),
                                     .nodes = {{.node_id = "a", .free_devices = 2, .device_ids = {}}},
                                     .avoid = {}};
  auto placement = topology::PlaceRanks(request);
  ASSERT_TRUE(placement.ok());
  auto assignments = BuildAssignments(s, *placement, AttemptContext{.job_id = "j"}, {});
  ASSERT_TRUE(assignments.ok()) << assignments.status();
  const auto& first = (*assignments)[0];
  const auto& last = (*assignments)[1];
  EXPECT_EQ(first.layers_size() + last.layers_size(), 4);
  EXPECT_EQ(first.layers(0), 0);
  EXPECT_EQ(last.layers(last.layers_size() - 1), 3);
  // 1F1B: the first stage starts with a forward, the last with a receive; both end
  // with the gradient reduction and the optimizer step.
  EXPECT_EQ(first.pipeline_instructions().rfind("F0 sA0@1", 0), 0u) << first.pipeline_instructions();
  EXPECT_EQ(last.pipeline_instructions().rfind("rA0@0 F0", 0), 0u) << last.pipeline_instructions();
  EXPECT_NE(last.pipeline_instructions().find("RG OPT"), std::string::npos);
  EXPECT_DOUBLE_EQ(first.pipeline_bubble_fraction(), 0.25);  // (p-1)/m
}

TEST(AssignmentBuilder, WrongPlacementSizeIsAnError) {
  spec::JobSpec s = Spec(2, 1, 1);
  topology::Placement placement;
  placement.slots.push_back({.node_id = "a", .local_device = 0});
  auto assignments = BuildAssignments(s, placement, AttemptContext{}, {});
  EXPECT_FALSE(assignments.ok());
}

}  // namespace
}  // namespace loom::coordinator
