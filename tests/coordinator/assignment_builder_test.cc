// Rank assignments: every rank gets its coordinates, groups, node and device,
// and the attempt's rendezvous namespace.
#include "coordinator/jobs/assignment_builder.h"

#include "common/spec/job_spec_rules.h"
#include "common/topology/mesh.h"
#include "gtest/gtest.h"
#include "proto/group_members.h"

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
                                     .nodes = {{.node_id = "a", .free_devices = 4, .device_ids = {},
                                                .nvlink_domain = "", .rack = ""},
                                               {.node_id = "b", .free_devices = 4, .device_ids = {},
                                                .nvlink_domain = "", .rack = ""}},
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
                                     .nodes = {{.node_id = "a", .free_devices = 2, .device_ids = {},
                                                .nvlink_domain = "", .rack = ""}},
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

// Large groups travel as arithmetic runs: the size of an assignment must not
// grow with the data-parallel degree (16,384 ranks would otherwise send
// 16,384 numbers per group to each of 16,384 ranks).
TEST(AssignmentBuilder, LargeGroupsAreRuns) {
  spec::JobSpec s = Spec(64, 2, 1);
  topology::PlacementRequest request{.shape = spec::LayoutOf(s),
                                     .nodes = {{.node_id = "a", .free_devices = 128, .device_ids = {},
                                                .nvlink_domain = "", .rack = ""}},
                                     .avoid = {}};
  auto placement = topology::PlaceRanks(request);
  ASSERT_TRUE(placement.ok());
  auto assignments = BuildAssignments(s, *placement, AttemptContext{.job_id = "j"}, {});
  ASSERT_TRUE(assignments.ok()) << assignments.status();
  const auto& r3 = (*assignments)[3];  // tp 1, dp 1
  const auto& dp = Group(r3, "dp");
  EXPECT_EQ(dp.ranks_size(), 0);
  ASSERT_EQ(dp.runs_size(), 1);
  std::vector<int> expected;
  for (int d = 0; d < 64; ++d) expected.push_back(2 * d + 1);
  EXPECT_EQ(proto::GroupMemberList(dp), expected);
  // Small groups stay lists, read the same way.
  const auto& tp = Group(r3, "tp");
  EXPECT_EQ(std::vector<int>(tp.ranks().begin(), tp.ranks().end()), (std::vector<int>{2, 3}));
  EXPECT_EQ(proto::GroupMemberList(tp), (std::vector<int>{2, 3}));
  EXPECT_LT(r3.ByteSizeLong(), 1000u);
}

// Groups are built once per group and shared: every rank still gets exactly
// the members the mesh gives it.
TEST(AssignmentBuilder, SharedGroupsMatchTheMesh) {
  spec::JobSpec s = Spec(12, 2, 2);
  s.train.micro_batch_size = 1;
  s.train.global_batch_size = 48;
  topology::PlacementRequest request{.shape = spec::LayoutOf(s),
                                     .nodes = {{.node_id = "a", .free_devices = 48, .device_ids = {},
                                                .nvlink_domain = "", .rack = ""}},
                                     .avoid = {}};
  auto placement = topology::PlaceRanks(request);
  ASSERT_TRUE(placement.ok());
  auto assignments = BuildAssignments(s, *placement, AttemptContext{.job_id = "j"}, {});
  ASSERT_TRUE(assignments.ok()) << assignments.status();
  auto mesh = topology::RankMesh::Create(spec::LayoutOf(s));
  ASSERT_TRUE(mesh.ok());
  for (const auto& a : *assignments) {
    auto groups = mesh->GroupsOf(a.rank());
    ASSERT_TRUE(groups.ok());
    auto members = [&](const char* axis) { return proto::GroupMemberList(Group(a, axis)); };
    auto ints = [](const std::vector<int64_t>& v) { return std::vector<int>(v.begin(), v.end()); };
    EXPECT_EQ(members("tp"), ints(groups->tp)) << a.rank();
    EXPECT_EQ(members("dp"), ints(groups->dp)) << a.rank();
    EXPECT_EQ(members("pp"), ints(groups->pp)) << a.rank();
    EXPECT_EQ(members("dp_cp"), ints(groups->dp_cp)) << a.rank();
    EXPECT_EQ(members("dp_ep_cp"), ints(groups->dp_ep_cp)) << a.rank();
    EXPECT_EQ(members("tp_cp"), ints(groups->tp_cp)) << a.rank();
    EXPECT_EQ(members("model"), ints(groups->model)) << a.rank();
    EXPECT_EQ(a.groups_size(), 9);
  }
}

TEST(GroupMembers, IrregularListsRoundTrip) {
  for (const std::vector<int64_t>& ranks :
       {std::vector<int64_t>{}, {5}, {0, 1, 2, 3, 4, 5, 6, 7, 8}, {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11},
        {9, 3, 3, 3, 7, 100, 2, 1, 0, 0, 50}}) {
    loom::v1::GroupMembers group;
    proto::SetGroupMembers(ranks, &group);
    EXPECT_EQ(proto::GroupMemberList(group), std::vector<int>(ranks.begin(), ranks.end()));
  }
}

TEST(AssignmentBuilder, WrongPlacementSizeIsAnError) {
  spec::JobSpec s = Spec(2, 1, 1);
  topology::Placement placement;
  placement.slots.push_back({.node_id = "a", .local_device = 0});
  auto assignments = BuildAssignments(s, placement, AttemptContext{}, {});
  EXPECT_FALSE(assignments.ok());
}

// A global batch of millions of micro-batches of one, through a pipeline:
// refused from its numbers, before a schedule or assignment is built.
TEST(AssignmentBuilder, ALaunchTooLargeIsRefusedBeforeAnythingIsBuilt) {
  spec::JobSpec s = Spec(1, 1, 2);
  s.train.micro_batch_size = 1;
  s.train.global_batch_size = 5'000'000;
  const absl::Status status = CheckLaunchSizeLowerBound(s, 16 << 20);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("at least 20000000 bytes"), std::string::npos) << status;
  // One that fits is left to the exact check; without a pipeline there is
  // no instruction list at all.
  s.train.global_batch_size = 1024;
  EXPECT_TRUE(CheckLaunchSizeLowerBound(s, 16 << 20).ok());
  s = Spec(2, 1, 1);
  s.train.micro_batch_size = 1;
  s.train.global_batch_size = 5'000'000;
  EXPECT_TRUE(CheckLaunchSizeLowerBound(s, 16 << 20).ok());
}

}  // namespace
}  // namespace loom::coordinator
