// The in-place recovery decision (coordinator/jobs/in_place_policy.h): a
// crashed rank and a hung culprit relaunched in their place, a lost node of a
// 2-node and of a 4-node job moved to a spare, the restore step from the
// survivors' holdings, and every whole-job fallback with its reason; then the
// messages built from a decision (in_place_messages.h).
#include "coordinator/jobs/in_place_policy.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "coordinator/jobs/in_place_messages.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using topology::DeviceSlot;

// Blocks of ranks: {"a", 4}, {"b", 4} -> a/0 a/1 a/2 a/3 b/0 b/1 b/2 b/3.
std::vector<DeviceSlot> Blocks(const std::vector<std::pair<std::string, int>>& blocks) {
  std::vector<DeviceSlot> slots;
  for (const auto& [node, count] : blocks) {
    for (int d = 0; d < count; ++d) slots.push_back({node, d});
  }
  return slots;
}

RelaunchNode Node(const std::string& id, int devices, bool cordoned = false) {
  RelaunchNode node{.node_id = id, .free_devices = {}, .cordoned = cordoned, .nvlink_domain = ""};
  for (int d = 0; d < devices; ++d) node.free_devices.push_back(d);
  return node;
}

// An aborted report holding its own snapshots of `own` and its ward's of `copies`.
loom::v1::RankProgress Aborted(int64_t step, std::vector<int64_t> own, int64_t ward,
                               std::vector<int64_t> copies) {
  loom::v1::RankProgress p;
  p.set_phase("aborted");
  p.set_step(step);
  for (int64_t s : own) p.mutable_snapshots()->add_own_steps(s);
  p.mutable_snapshots()->set_ward_rank(static_cast<int32_t>(ward));
  for (int64_t s : copies) p.mutable_snapshots()->add_ward_steps(s);
  return p;
}

// Every survivor reports step `step` holding its own and its ward's snapshots
// of `steps`.
void AllHold(InPlaceRequest& request, int64_t step, const std::vector<int64_t>& steps) {
  const topology::SnapshotRing ring = topology::BuildSnapshotRing(request.placement);
  const std::vector<int64_t> failed = FailedRanks(request);
  const std::set<int64_t> gone(failed.begin(), failed.end());
  for (int64_t r = 0; r < static_cast<int64_t>(request.placement.size()); ++r) {
    if (gone.count(r) == 0) request.aborted[r] = Aborted(step, steps, ring.WardOf(r), steps);
  }
}

// A dp job on 2 nodes of 4 devices, every device the job's.
InPlaceRequest TwoNodes() {
  InPlaceRequest request;
  request.placement = Blocks({{"a", 4}, {"b", 4}});
  request.nodes = {Node("a", 4), Node("b", 4)};
  request.newest_step = 8;
  return request;
}

// A dp job on 4 nodes of 2 ranks each.
InPlaceRequest FourNodes() {
  InPlaceRequest request;
  request.placement = Blocks({{"a", 2}, {"b", 2}, {"c", 2}, {"d", 2}});
  request.nodes = {Node("a", 2), Node("b", 2), Node("c", 2), Node("d", 2)};
  request.newest_step = 8;
  return request;
}

InPlaceDecision Decide(const InPlaceRequest& request) {
  absl::StatusOr<InPlaceDecision> decision = DecideInPlace(request);
  EXPECT_TRUE(decision.ok()) << decision.status();
  return decision.ok() ? *decision : InPlaceDecision{};
}

std::vector<int64_t> RanksOf(const InPlaceDecision& d) {
  std::vector<int64_t> ranks;
  for (const Relaunch& r : d.relaunched) ranks.push_back(r.rank);
  return ranks;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(InPlacePolicyTest, ACrashedRankIsRelaunchedInItsPlaceAndGetsItsCopyFromItsBuddy) {
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {2};
  AllHold(request, 8, {7, 8});
  const InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_TRUE(d.fallback_reason.empty());
  EXPECT_EQ(d.restore_step, 8);
  EXPECT_EQ(d.steps_recomputed, 0);
  ASSERT_EQ(RanksOf(d), std::vector<int64_t>{2});
  const Relaunch& r = d.relaunched[0];
  EXPECT_FALSE(r.moved());
  EXPECT_EQ(r.to, (DeviceSlot{"a", 2}));
  EXPECT_EQ(r.peer, 6);  // the same local index on the next node
  EXPECT_EQ(d.sends, (std::map<int64_t, std::vector<int64_t>>{{6, {2}}}));
  EXPECT_EQ(d.placement, request.placement);
  EXPECT_EQ(d.ring.buddy, topology::BuildSnapshotRing(request.placement).buddy);
}

TEST(InPlacePolicyTest, TheRestoreStepIsTheNewestTheBuddyHoldsACopyOf) {
  // Rank 6's copy of rank 2's step 8 was still on its way: step 7, one step
  // recomputed.
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {2};
  AllHold(request, 8, {7, 8});
  request.aborted[6] = Aborted(8, {7, 8}, 2, {7});
  const InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(d.restore_step, 7);
  EXPECT_EQ(d.steps_recomputed, 1);
}

// CI saw this with two generations of its own: rank 2 died while its copy
// of step 20 was on its way to its buddy, which had given up on it and
// captured step 21, as had the others. The survivors' third generation still
// holds step 19, the buddy's newest copy.
TEST(InPlacePolicyTest, ACopyCutShortByTheFailureRestoresTheStepBefore) {
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {2};
  request.newest_step = 21;
  AllHold(request, 21, {19, 20, 21});
  request.aborted[6] = Aborted(21, {19, 20, 21}, 2, {19});
  const InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(d.restore_step, 19);
  EXPECT_EQ(d.steps_recomputed, 2);
}

TEST(InPlacePolicyTest, StepsRecomputedCountFromTheNewestStepAnyoneReported) {
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {2};
  request.newest_step = 7;  // rank 0's report of step 8 had not arrived
  AllHold(request, 7, {6, 7});
  request.aborted[3] = Aborted(8, {6, 7}, request.aborted[3].snapshots().ward_rank(), {6, 7});
  const InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(d.newest_step, 8);
  EXPECT_EQ(d.restore_step, 7);
  EXPECT_EQ(d.steps_recomputed, 1);
}

TEST(InPlacePolicyTest, AHungCulpritIsKilledAndRelaunchedLikeACrash) {
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {5};  // the diagnosed culprit
  request.avoid = {"b"};       // it failed the job there: its own place is still first
  AllHold(request, 12, {11, 12});
  const InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  ASSERT_EQ(RanksOf(d), std::vector<int64_t>{5});
  EXPECT_EQ(d.relaunched[0].to, (DeviceSlot{"b", 1}));
  EXPECT_EQ(d.relaunched[0].peer, 1);
  EXPECT_EQ(d.restore_step, 12);
}

TEST(InPlacePolicyTest, ALostNodeOfATwoNodeJobMovesToASpareNode) {
  InPlaceRequest request = TwoNodes();
  request.lost_nodes = {"b"};
  request.nodes = {Node("a", 4), Node("c", 8)};
  AllHold(request, 8, {7, 8});
  const InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(RanksOf(d), (std::vector<int64_t>{4, 5, 6, 7}));
  for (int i = 0; i < 4; ++i) {
    const Relaunch& r = d.relaunched[i];
    EXPECT_TRUE(r.moved());
    EXPECT_EQ(r.from, (DeviceSlot{"b", i}));
    EXPECT_EQ(r.to, (DeviceSlot{"c", i}));
    EXPECT_EQ(r.peer, i);  // the survivor on a with the same local index
  }
  EXPECT_EQ(d.placement, Blocks({{"a", 4}, {"c", 4}}));
  // The new ring pairs a with c: losing either loses nothing again.
  EXPECT_EQ(d.ring.buddy, (std::vector<int64_t>{4, 5, 6, 7, 0, 1, 2, 3}));
  EXPECT_EQ(d.restore_step, 8);
}

TEST(InPlacePolicyTest, ALostNodeOfAFourNodeJobMovesItsRanksTogether) {
  InPlaceRequest request = FourNodes();
  request.lost_nodes = {"c"};
  request.nodes = {Node("a", 2), Node("b", 2), Node("d", 2), Node("e", 1), Node("f", 4)};
  AllHold(request, 8, {7, 8});
  const InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(RanksOf(d), (std::vector<int64_t>{4, 5}));
  // f, the spare that holds both (e holds one), takes both.
  EXPECT_EQ(d.relaunched[0].to, (DeviceSlot{"f", 0}));
  EXPECT_EQ(d.relaunched[1].to, (DeviceSlot{"f", 1}));
  // Their copies were on d, the next node of the old ring.
  EXPECT_EQ(d.relaunched[0].peer, 6);
  EXPECT_EQ(d.relaunched[1].peer, 7);
  EXPECT_EQ(d.sends, (std::map<int64_t, std::vector<int64_t>>{{6, {4}}, {7, {5}}}));
  EXPECT_TRUE(d.ring.Unprotected().empty());
}

TEST(InPlacePolicyTest, ASpareIsPreferredElseANodeOfTheJobWithRoom) {
  InPlaceRequest request = FourNodes();
  request.lost_nodes = {"c"};
  // a has two devices the job does not use; e is a spare.
  request.nodes = {Node("a", 4), Node("b", 2), Node("d", 2), Node("e", 2)};
  AllHold(request, 8, {7, 8});
  InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(d.relaunched[0].to, (DeviceSlot{"e", 0}));
  EXPECT_EQ(d.relaunched[1].to, (DeviceSlot{"e", 1}));
  // Without the spare, a.
  request.nodes = {Node("a", 4), Node("b", 2), Node("d", 2)};
  d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(d.relaunched[0].to, (DeviceSlot{"a", 2}));
  EXPECT_EQ(d.relaunched[1].to, (DeviceSlot{"a", 3}));
  // a now holds half the job: every rank still has a buddy on another node.
  EXPECT_TRUE(d.ring.Unprotected().empty());
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_NE(d.placement[d.ring.buddy[r]].node_id, d.placement[r].node_id) << r;
  }
}

TEST(InPlacePolicyTest, ANodeThatFailedTheJobIsUsedOnlyWhenNoOtherHasRoom) {
  InPlaceRequest request = TwoNodes();
  request.lost_nodes = {"b"};
  request.nodes = {Node("a", 4), Node("c", 8), Node("d", 4)};
  request.avoid = {"c"};
  AllHold(request, 8, {7, 8});
  InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  for (const Relaunch& r : d.relaunched) EXPECT_EQ(r.to.node_id, "d") << r.rank;
  // Without d, c it is.
  request.nodes = {Node("a", 4), Node("c", 8)};
  d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  for (const Relaunch& r : d.relaunched) EXPECT_EQ(r.to.node_id, "c") << r.rank;
}

TEST(InPlacePolicyTest, ACordonedNodeTakesNoRelaunchedRankNotEvenInItsOldPlace) {
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {2};
  request.nodes = {Node("a", 4, /*cordoned=*/true), Node("b", 4), Node("c", 1)};
  AllHold(request, 8, {7, 8});
  const InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(d.relaunched[0].to, (DeviceSlot{"c", 0}));
  EXPECT_EQ(d.relaunched[0].peer, 6);
}

TEST(InPlacePolicyTest, ATpGroupStaysOnOneNode) {
  // tp=2 on 2 nodes of 4: TP groups {0,1} {2,3} on a, {4,5} {6,7} on b.
  InPlaceRequest request = TwoNodes();
  request.tp = 2;
  request.lost_nodes = {"b"};
  request.nodes = {Node("a", 4), Node("c", 3), Node("d", 2)};
  AllHold(request, 8, {7, 8});
  InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  // No node holds all four: the largest takes a whole group, the other the rest.
  EXPECT_EQ(d.placement[4].node_id, d.placement[5].node_id);
  EXPECT_EQ(d.placement[6].node_id, d.placement[7].node_id);
  EXPECT_EQ(d.placement[4].node_id, "c");
  EXPECT_EQ(d.placement[6].node_id, "d");

  // A crashed rank whose TP peer lives on a cordoned node cannot join it.
  request = TwoNodes();
  request.tp = 2;
  request.failed_ranks = {3};
  request.nodes = {Node("a", 4, /*cordoned=*/true), Node("b", 4), Node("c", 8)};
  AllHold(request, 8, {7, 8});
  d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_TRUE(Contains(d.fallback_reason, "TP group runs on node a, which is cordoned"))
      << d.fallback_reason;
}

TEST(InPlacePolicyTest, ATpGroupsMovingPartMayJoinItInItsNvlinkDomain) {
  // tp=4 across a and b (one NVLink domain, 2 devices each): TP group {0,1,2,3}.
  InPlaceRequest request;
  request.tp = 4;
  request.placement = Blocks({{"a", 2}, {"b", 2}});
  request.newest_step = 8;
  request.failed_ranks = {3};
  RelaunchNode a = Node("a", 2), b = Node("b", 2, /*cordoned=*/true), c = Node("c", 2),
               e = Node("e", 4);
  a.nvlink_domain = b.nvlink_domain = c.nvlink_domain = "d0";
  request.nodes = {a, b, c, e};  // e has more room but is outside the domain
  AllHold(request, 8, {7, 8});
  InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(d.placement[3].node_id, "c");

  // No node of the domain has room: the whole job restarts, saying why.
  request.nodes = {a, b, e};
  d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_TRUE(Contains(d.fallback_reason, "a TP group stays on one node (or one nvlink_domain)"))
      << d.fallback_reason;
}

TEST(InPlacePolicyTest, ARankAndItsBuddyLostTogetherFallBackToTheWholeJob) {
  InPlaceRequest request = FourNodes();
  request.failed_ranks = {0, 2};  // 2 is 0's buddy
  AllHold(request, 8, {7, 8});
  InPlaceDecision d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_EQ(d.fallback_reason,
            "rank 0 and its buddy rank 2, which holds its snapshot copies, failed together");
  EXPECT_TRUE(d.relaunched.empty());
  // Two lost nodes next to each other on the ring: the same, naming them.
  request = FourNodes();
  request.lost_nodes = {"b", "c"};
  d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_TRUE(Contains(d.fallback_reason, "rank 2 and its buddy rank 4")) << d.fallback_reason;
  EXPECT_TRUE(Contains(d.fallback_reason, "(nodes b, c were lost)")) << d.fallback_reason;
  // Two failed ranks that are not each other's buddies: in place.
  request = FourNodes();
  request.failed_ranks = {0, 5};
  AllHold(request, 8, {7, 8});
  d = Decide(request);
  EXPECT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(RanksOf(d), (std::vector<int64_t>{0, 5}));
}

TEST(InPlacePolicyTest, TheSpecCanTurnItOff) {
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {2};
  AllHold(request, 8, {7, 8});
  request.fault_tolerance.in_place = false;
  InPlaceDecision d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_EQ(d.fallback_reason, "in-place recovery is off (fault_tolerance.in_place: false)");
  request.fault_tolerance.in_place = true;
  request.fault_tolerance.snapshot_interval = 0;
  d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_TRUE(Contains(d.fallback_reason, "fault_tolerance.snapshot_interval is 0"))
      << d.fallback_reason;
}

TEST(InPlacePolicyTest, ARankOfAOneNodeJobHasItsBuddyOnItsNode) {
  InPlaceRequest request;
  request.placement = Blocks({{"a", 4}});
  request.nodes = {Node("a", 4)};
  request.failed_ranks = {1};
  AllHold(request, 8, {7, 8});
  InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  ASSERT_EQ(d.relaunched.size(), 1u);
  EXPECT_EQ(d.relaunched[0].peer, 2);  // the next rank on the node holds its copies
  EXPECT_FALSE(d.relaunched[0].moved());
  EXPECT_EQ(d.restore_step, 8);
  // Losing the node loses every rank and both copies: the whole job restarts.
  request.failed_ranks.clear();
  request.lost_nodes = {"a"};
  request.nodes.clear();
  d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_EQ(d.fallback_reason,
            "every rank failed (node a was lost); no survivor is left to recover in place");
}

TEST(InPlacePolicyTest, ARankWithoutABuddyCannotBeRelaunched) {
  // 2 + 1: rank 1 of a is left over with no one to pair with (docs/topology.md).
  InPlaceRequest request;
  request.placement = Blocks({{"a", 2}, {"b", 1}});
  request.nodes = {Node("a", 2), Node("b", 1)};
  request.failed_ranks = {1};
  InPlaceDecision d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_EQ(d.fallback_reason,
            "rank 1 has no buddy to hold a copy of its snapshots: it is the one rank of node a "
            "that no other rank can pair with (docs/topology.md, snapshot ring)");
  // 6 + 2: ranks 2-5 of a hold each other's copies on a; losing a loses them.
  request.placement = Blocks({{"a", 6}, {"b", 2}});
  request.nodes = {Node("a", 6), Node("b", 2)};
  request.failed_ranks = {3};
  AllHold(request, 8, {8});
  EXPECT_TRUE(Decide(request).in_place);
  request.failed_ranks.clear();
  request.lost_nodes = {"a"};
  request.nodes = {Node("b", 2), Node("c", 8)};
  d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_TRUE(Contains(d.fallback_reason, "failed together (node a was lost)"))
      << d.fallback_reason;
  request.lost_nodes.clear();
  request.nodes = {Node("a", 6), Node("b", 2)};
  request.failed_ranks = {1};  // paired with 7: covered
  AllHold(request, 8, {8});
  EXPECT_TRUE(Decide(request).in_place);
}

TEST(InPlacePolicyTest, NoDeviceToRelaunchOnFallsBack) {
  InPlaceRequest request = TwoNodes();
  request.lost_nodes = {"b"};
  request.nodes = {Node("a", 4)};
  const InPlaceDecision d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_EQ(d.fallback_reason,
            "no live node of the job's device kind has a free device to relaunch rank 4 (its "
            "node b was lost)");
}

TEST(InPlacePolicyTest, NoDeviceForAJobThatMayShrinkSpillsTheRestoreStep) {
  InPlaceRequest request = TwoNodes();
  request.lost_nodes = {"b"};
  request.nodes = {Node("a", 4)};
  request.spill_when_no_room = true;
  // At the declaration: no report read, the survivors are to abort.
  absl::StatusOr<InPlaceDecision> plan = PlanRelaunch(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->in_place);
  EXPECT_TRUE(plan->spill);
  EXPECT_EQ(plan->restore_step, -1);
  EXPECT_TRUE(Contains(plan->fallback_reason, "no live node of the job's device kind has a free "
                                              "device to relaunch rank 4"))
      << plan->fallback_reason;
  // The failed ranks and the buddies that write their copies (ranks 4-7 of
  // node b, held by ranks 0-3 of node a).
  EXPECT_EQ(RanksOf(*plan), (std::vector<int64_t>{4, 5, 6, 7}));
  for (const Relaunch& r : plan->relaunched) {
    EXPECT_EQ(r.peer, r.rank - 4);
    EXPECT_FALSE(r.moved());
  }
  EXPECT_TRUE(plan->placement.empty());
  // Once the survivors reported: the newest step they all hold, with the
  // buddies' copies.
  AllHold(request, 9, {7, 8});
  request.aborted[1] = Aborted(9, {7, 8, 9}, 5, {7, 8});  // its own copy of 9 is no use alone
  const InPlaceDecision d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_TRUE(d.spill);
  EXPECT_EQ(d.restore_step, 8);
  EXPECT_EQ(d.newest_step, 9);
  EXPECT_EQ(d.steps_recomputed, 1);
}

TEST(InPlacePolicyTest, ASpillThatCannotBeWrittenFallsBackToTheWholeJob) {
  InPlaceRequest request = TwoNodes();
  request.lost_nodes = {"b"};
  request.nodes = {Node("a", 4)};
  request.spill_when_no_room = true;
  AllHold(request, 8, {7, 8});
  request.aborted[2] = Aborted(8, {7, 8}, 5, {});  // holds no copy of its ward's
  InPlaceDecision d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_FALSE(d.spill);
  EXPECT_TRUE(Contains(d.fallback_reason, "rank 2 holds copies of rank 6's steps []") ||
              Contains(d.fallback_reason, "rank 2, the buddy of rank 6"))
      << d.fallback_reason;
  // A survivor that never reported: nothing to spill from it.
  AllHold(request, 8, {7, 8});
  request.aborted.erase(1);
  d = Decide(request);
  EXPECT_FALSE(d.spill);
  EXPECT_TRUE(Contains(d.fallback_reason, "rank 1 did not report")) << d.fallback_reason;
  // A job that may not shrink is restarted whole at once, as before.
  request.spill_when_no_room = false;
  absl::StatusOr<InPlaceDecision> plan = PlanRelaunch(request);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->spill);
  EXPECT_FALSE(plan->in_place);
}

TEST(InPlacePolicyTest, NothingNamedOrEverythingFailedIsAWholeJobRestart) {
  InPlaceRequest request = TwoNodes();
  InPlaceDecision d = Decide(request);  // a hang without a culprit
  EXPECT_FALSE(d.in_place);
  EXPECT_EQ(d.fallback_reason, "the failure names no rank or node to relaunch");
  request.lost_nodes = {"a", "b"};
  d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_TRUE(Contains(d.fallback_reason, "every rank failed")) << d.fallback_reason;
}

TEST(InPlacePolicyTest, SurvivorsMissingFromTheReportsFallBackNamingThem) {
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {2};
  AllHold(request, 8, {7, 8});
  request.aborted.erase(3);
  request.aborted.erase(7);
  request.fault_tolerance.abort_timeout_s = 10;
  const InPlaceDecision d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_EQ(d.fallback_reason,
            "ranks 3, 7 did not report leaving their collectives within "
            "fault_tolerance.abort_timeout_s (10 s)");
  // Where each was by its last health report, when the lifecycle knows.
  request.last_seen[3] = "backward of micro-batch 1 for 12s; last report 0.4s ago";
  request.last_seen[7] = "never reported";
  EXPECT_EQ(Decide(request).fallback_reason,
            "ranks 3, 7 did not report leaving their collectives within "
            "fault_tolerance.abort_timeout_s (10 s); rank 3 was in phase backward of micro-batch "
            "1 for 12s; last report 0.4s ago; rank 7 never reported");
  request.last_seen.clear();
  // PlanRelaunch reads no report: at the declaration it says in place.
  absl::StatusOr<InPlaceDecision> plan = PlanRelaunch(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->in_place);
  EXPECT_EQ(plan->restore_step, -1);
}

TEST(InPlacePolicyTest, NoStepHeldByEveryoneFallsBack) {
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {2};
  AllHold(request, 8, {7, 8});
  request.aborted[6] = Aborted(8, {7, 8}, 2, {5, 6});
  InPlaceDecision d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_EQ(d.fallback_reason,
            "no snapshot step is held by every survivor and by the buddies of the failed ranks: "
            "the survivors hold steps 7, 8, rank 6 holds copies of rank 2's steps 5, 6");
  // Survivors that hold no common step at all.
  AllHold(request, 8, {7, 8});
  request.aborted[4] = Aborted(8, {9, 10}, request.aborted[4].snapshots().ward_rank(), {9, 10});
  d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_TRUE(Contains(d.fallback_reason, "the survivors hold no snapshot step in common: rank 4"))
      << d.fallback_reason;
  // A buddy that holds no copy of its ward.
  AllHold(request, 8, {7, 8});
  request.aborted[6] = Aborted(8, {7, 8}, -1, {});
  d = Decide(request);
  EXPECT_FALSE(d.in_place);
  EXPECT_EQ(d.fallback_reason, "rank 6, the buddy of rank 2, holds no copy of its snapshots");
}

TEST(InPlacePolicyTest, AMalformedRequestIsAnError) {
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {8};
  EXPECT_EQ(PlanRelaunch(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.failed_ranks = {1};
  request.ring.buddy = {1, 0};
  request.ring.ward = {1, 0};
  EXPECT_EQ(PlanRelaunch(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.ring = {};
  request.tp = 3;
  EXPECT_EQ(PlanRelaunch(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.tp = 1;
  request.placement.clear();
  EXPECT_EQ(PlanRelaunch(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InPlacePolicyTest, TheRingGivenIsTheOneFollowed) {
  // A ring of another rule than today's (an older coordinator's): the copy is
  // where that ring sent it.
  InPlaceRequest request = TwoNodes();
  request.failed_ranks = {0};
  request.ring.buddy = {7, 6, 5, 4, 3, 2, 1, 0};
  request.ring.ward = {7, 6, 5, 4, 3, 2, 1, 0};
  for (int64_t r = 1; r < 8; ++r) request.aborted[r] = Aborted(8, {8}, 7 - r, {8});
  const InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(d.relaunched[0].peer, 7);
}

TEST(InPlaceMessagesTest, AssignmentsAndEpochsCarryTheDecision) {
  InPlaceRequest request = TwoNodes();
  request.lost_nodes = {"b"};
  request.nodes = {Node("a", 4), Node("c", 4)};
  AllHold(request, 8, {7, 8});
  const InPlaceDecision d = Decide(request);
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  // What BuildAssignments would give over d.placement, with tokens.
  std::vector<loom::v1::RankAssignment> assignments(8);
  for (int r = 0; r < 8; ++r) {
    loom::v1::RankAssignment& a = assignments[r];
    a.set_job_id("job-1");
    a.set_attempt(3);
    a.set_rank(r);
    a.set_node_id(d.placement[r].node_id);
    a.set_local_device(static_cast<int32_t>(d.placement[r].local_device));
    a.set_store_namespace("job-1/attempt-3-x");
    a.set_rank_token("token-" + std::to_string(r));
  }
  ApplyInPlace(d, assignments);
  EXPECT_EQ(assignments[0].restore().source(), loom::v1::RestorePlan::OWN_SNAPSHOT);
  EXPECT_EQ(assignments[0].restore().step(), 8);
  EXPECT_EQ(assignments[0].snapshots().buddy_rank(), 4);
  EXPECT_EQ(std::vector<int32_t>(assignments[0].snapshots().send_snapshot_to().begin(),
                                 assignments[0].snapshots().send_snapshot_to().end()),
            std::vector<int32_t>{4});
  EXPECT_EQ(assignments[5].restore().source(), loom::v1::RestorePlan::PEER_SNAPSHOT);
  EXPECT_EQ(assignments[5].restore().peer_rank(), 1);
  EXPECT_EQ(assignments[5].restore().step(), 8);
  EXPECT_EQ(assignments[5].snapshots().send_snapshot_to_size(), 0);

  const std::map<std::string, loom::v1::EnterEpoch> epochs = EnterEpochsByNode(d, assignments, 2);
  ASSERT_EQ(epochs.size(), 1u);  // only a runs survivors
  const loom::v1::EnterEpoch& epoch = epochs.at("a");
  EXPECT_EQ(epoch.job_id(), "job-1");
  EXPECT_EQ(epoch.from_attempt(), 2);
  EXPECT_EQ(epoch.attempt(), 3);
  EXPECT_EQ(epoch.store_namespace(), "job-1/attempt-3-x");
  EXPECT_EQ(epoch.restore_step(), 8);
  ASSERT_EQ(epoch.ranks_size(), 4);
  EXPECT_EQ(epoch.ranks(2).rank(), 2);
  EXPECT_EQ(epoch.ranks(2).rank_token(), "token-2");
  EXPECT_EQ(epoch.ranks(2).snapshots().send_snapshot_to(0), 6);

  EXPECT_EQ(RanksByNode(request.placement, {1, 4, 5}),
            (std::map<std::string, std::vector<int32_t>>{{"a", {1}}, {"b", {4, 5}}}));
}

TEST(InPlaceMessagesTest, AFreshPlacementGetsItsRingFromTheJobsPlacement) {
  google::protobuf::RepeatedPtrField<loom::v1::RankPlacement> placement;
  // In any order: slots are by rank.
  for (int r : {3, 1, 0, 2}) {
    loom::v1::RankPlacement* p = placement.Add();
    p->set_rank(r);
    p->set_node_id(r < 2 ? "a" : "b");
    p->set_local_device(r % 2);
  }
  const std::vector<DeviceSlot> slots = SlotsOf(placement);
  EXPECT_EQ(slots, Blocks({{"a", 2}, {"b", 2}}));
  std::vector<loom::v1::RankAssignment> assignments(4);
  for (int r = 0; r < 4; ++r) assignments[r].set_rank(r);
  SetSnapshotRings(topology::BuildSnapshotRing(slots), assignments);
  EXPECT_EQ(assignments[1].snapshots().buddy_rank(), 3);
  EXPECT_EQ(assignments[1].snapshots().ward_rank(), 3);
  EXPECT_EQ(assignments[1].restore().source(), loom::v1::RestorePlan::CHECKPOINT);
}

}  // namespace
}  // namespace loom::coordinator
