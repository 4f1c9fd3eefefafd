// loom-loadgen's rank as a state machine (tools/loadgen/rank_life.h), driven
// through whole attempts without gRPC: its rendezvous ops against the
// coordinator's own store (coordinator/rendezvous/kv_store.h, with the
// tokens of each namespace checked here), its reports, and a recovery in
// place decided by the coordinator's own rules over the ranks' "aborted"
// reports (tests/loadgen/test_job.h).
#include "tools/loadgen/rank_life.h"

#include <map>
#include <memory>

#include "common/rpc/rank_entries.h"
#include "coordinator/rendezvous/kv_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/loadgen/test_job.h"

namespace loom::loadgen {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using testing::TestJob;
using Phase = RankLife::Phase;

const absl::Time kT0 = absl::FromUnixSeconds(2'000'000);
absl::Time At(double s) { return kT0 + absl::Seconds(s); }
int64_t Us(double s) { return absl::ToUnixMicros(At(s)); }

// The coordinator's store, with the rank service's check that an op's
// token opens its namespace (the rank token names one attempt).
class Store {
 public:
  void Open(int32_t attempt, int world, const coordinator::CarriedEntries* carried = nullptr) {
    kv_.OpenNamespace(TestJob::Namespace(attempt), {}, carried);
    for (int r = 0; r < world; ++r)
      tokens_[TestJob::Token(attempt, r)] = TestJob::Namespace(attempt);
  }
  absl::StatusOr<int64_t> Apply(const loom::v1::StoreOp& op) {
    const std::string& ns = op.has_set() ? op.set().store_namespace() : op.add().store_namespace();
    auto it = tokens_.find(op.rank_token());
    if (it == tokens_.end() || it->second != ns) {
      return absl::PermissionDeniedError("the token does not open " + ns);
    }
    ++writes_[ns];
    if (op.has_set()) {
      absl::Status s = kv_.Set(ns, op.set().key(), op.set().value());
      if (!s.ok()) return s;
      return 0;
    }
    return kv_.Add(ns, op.add().key(), op.add().delta());
  }
  absl::StatusOr<std::string> Get(const std::string& ns, const std::string& key) {
    return kv_.Get(ns, key, absl::Milliseconds(10));
  }
  int64_t writes(const std::string& ns) { return writes_[ns]; }

 private:
  coordinator::KvStore kv_;
  std::map<std::string, std::string> tokens_;
  std::map<std::string, int64_t> writes_;  // sets and adds admitted, by namespace
};

// Every rank in kLaunched does its rendezvous (as the node drives it:
// address, join, the last joiner's go, the shared get of go; a survivor
// whose entries were carried only the get).
void Rendezvous(const std::vector<RankLife*>& ranks, Store& store) {
  for (RankLife* r : ranks) {
    ASSERT_EQ(r->phase(), Phase::kLaunched);
    if (r->carried()) {
      r->BeginCarried();
      EXPECT_EQ(r->phase(), Phase::kJoining);
      continue;
    }
    ASSERT_TRUE(store.Apply(r->Begin()).ok());
    EXPECT_EQ(r->phase(), Phase::kJoining);
    absl::StatusOr<int64_t> joined = store.Apply(r->JoinOp());
    ASSERT_TRUE(joined.ok()) << joined.status();
    if (r->IsLastJoiner(*joined)) {
      ASSERT_TRUE(store.Apply(r->ReleaseOp()).ok());
    }
  }
  for (RankLife* r : ranks) {
    ASSERT_TRUE(store.Get(r->store_namespace(), RankLife::kGoKey).ok());
    r->PassedBarrier();
    EXPECT_EQ(r->phase(), Phase::kJoined);
  }
}

// Ready and resumed, as the node's batch sends them; the clock learns it.
std::vector<loom::v1::RankProgress> Resume(const std::vector<RankLife*>& ranks, JobClock& clock,
                                           double at) {
  std::vector<loom::v1::RankProgress> reports;
  for (RankLife* r : ranks) {
    loom::v1::RankProgress ready, resumed;
    r->FillReady(&ready, Us(at));
    r->FillResumed(&resumed, Us(at));
    EXPECT_EQ(ready.phase(), "ready");
    EXPECT_EQ(resumed.phase(), "resumed");
    EXPECT_EQ(r->phase(), Phase::kRunning);
    clock.Resumed(r->attempt(), r->rank(), At(at));
    reports.push_back(resumed);
  }
  return reports;
}

std::vector<RankLife*> Raw(const std::vector<std::unique_ptr<RankLife>>& ranks) {
  std::vector<RankLife*> raw;
  for (const auto& r : ranks) {
    if (r->alive()) raw.push_back(r.get());
  }
  return raw;
}

std::vector<int64_t> Steps(const google::protobuf::RepeatedField<int64_t>& steps) {
  return {steps.begin(), steps.end()};
}

TEST(RankLife, ALaunchedRankJoinsReportsAndHoldsItsAndItsWardsLastTwoSteps) {
  TestJob job({"n0", "n1"}, 2);
  std::vector<loom::v1::RankAssignment> launch = job.Launch();
  RankLife rank(launch[1]);
  EXPECT_EQ(rank.attempt(), 1);
  EXPECT_EQ(rank.base_step(), 0);
  EXPECT_EQ(rank.ward_rank(), job.ring().WardOf(1));

  const loom::v1::StoreOp set = rank.Begin();
  EXPECT_EQ(set.rank_token(), TestJob::Token(1, 1));
  EXPECT_EQ(set.set().store_namespace(), TestJob::Namespace(1));
  EXPECT_EQ(rank.JoinOp().add().key(), RankLife::kJoinedKey);
  EXPECT_TRUE(rank.IsLastJoiner(4));
  EXPECT_FALSE(rank.IsLastJoiner(3));
  EXPECT_EQ(rank.ReleaseOp().set().key(), RankLife::kGoKey);
  rank.PassedBarrier();

  JobClock clock(absl::Seconds(1));
  clock.BeginAttempt(1, 0, 4, At(0));
  loom::v1::RankProgress ready, resumed;
  rank.FillReady(&ready, Us(0));
  rank.FillResumed(&resumed, Us(0));
  EXPECT_EQ(resumed.resumed_step(), 0);
  for (int r = 0; r < 4; ++r) clock.Resumed(1, r, At(0));

  // Before its first step it waits in the all-reduce of step 1.
  loom::v1::RankProgress report;
  EXPECT_FALSE(rank.FillStep(&report, clock.At(At(0.5)), Us(0.5)));
  EXPECT_EQ(report.phase(), "forward_backward");
  ASSERT_EQ(report.groups_size(), 1);
  EXPECT_EQ(report.groups(0).completed(), 0);
  EXPECT_EQ(report.groups(0).issued(), 1);

  report.Clear();
  EXPECT_TRUE(rank.FillStep(&report, clock.At(At(1.2)), Us(1.2)));  // its first step
  EXPECT_EQ(report.phase(), "step");
  EXPECT_EQ(report.step(), 1);
  EXPECT_THAT(Steps(report.snapshots().own_steps()), ElementsAre(1));
  report.Clear();
  EXPECT_FALSE(rank.FillStep(&report, clock.At(At(3.5)), Us(3.5)));
  EXPECT_EQ(report.step(), 3);
  EXPECT_THAT(Steps(report.snapshots().own_steps()), ElementsAre(2, 3));
  EXPECT_EQ(report.snapshots().ward_rank(), job.ring().WardOf(1));
  EXPECT_THAT(Steps(report.snapshots().ward_steps()), ElementsAre(2, 3));
  // The same step again: not a new step report.
  report.Clear();
  EXPECT_FALSE(rank.FillStep(&report, clock.At(At(3.9)), Us(3.9)));
  EXPECT_EQ(report.phase(), "forward_backward");
}

TEST(RankLife, AbortThenEnterMovesItToTheNextAttempt) {
  TestJob job({"n0", "n1"}, 2);
  RankLife rank(job.Launch()[0]);
  rank.Begin();
  rank.PassedBarrier();
  loom::v1::RankProgress p;
  rank.FillResumed(&p, Us(0));
  EXPECT_FALSE(rank.Abort(2, 7));  // not its attempt
  EXPECT_TRUE(rank.Abort(1, 7));
  EXPECT_FALSE(rank.Abort(1, 7));  // told twice: once
  EXPECT_EQ(rank.phase(), Phase::kAborted);
  ASSERT_TRUE(rank.abort_pending());
  loom::v1::RankProgress aborted;
  rank.FillAborted(&aborted, Us(8));
  EXPECT_FALSE(rank.abort_pending());
  EXPECT_EQ(aborted.phase(), "aborted");
  EXPECT_EQ(aborted.attempt(), 1);
  EXPECT_EQ(aborted.step(), 7);
  EXPECT_THAT(Steps(aborted.snapshots().own_steps()), ElementsAre(6, 7));

  loom::v1::EnterEpoch epoch;
  epoch.set_job_id(TestJob::kJobId);
  epoch.set_from_attempt(1);
  epoch.set_attempt(2);
  epoch.set_store_namespace(TestJob::Namespace(2));
  epoch.set_restore_step(8);  // a step it never completed
  loom::v1::RankEpoch entry;
  entry.set_rank(0);
  entry.set_rank_token(TestJob::Token(2, 0));
  entry.mutable_snapshots()->set_ward_rank(rank.ward_rank());
  std::vector<int32_t> not_held;
  absl::Status refused = rank.Enter(epoch, entry, &not_held);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("holds its own snapshots of steps [6, 7]"));
  EXPECT_EQ(rank.attempt(), 1);  // unchanged

  epoch.set_restore_step(6);
  entry.mutable_snapshots()->add_send_snapshot_to(3);  // not its ward
  ASSERT_TRUE(rank.Enter(epoch, entry, &not_held).ok());
  EXPECT_THAT(not_held, ElementsAre(3));
  EXPECT_EQ(rank.attempt(), 2);
  EXPECT_EQ(rank.rank_token(), TestJob::Token(2, 0));
  EXPECT_EQ(rank.store_namespace(), TestJob::Namespace(2));
  EXPECT_EQ(rank.base_step(), 6);
  EXPECT_EQ(rank.phase(), Phase::kLaunched);
  EXPECT_FALSE(rank.past_first_step());
  // Rolled back to 6: it holds 6 (its own, and its unchanged ward's).
  EXPECT_THAT(rank.OwnSteps(6), ElementsAre(6));
  EXPECT_THAT(rank.WardSteps(6), ElementsAre(6));
  EXPECT_THAT(rank.OwnSteps(8), ElementsAre(7, 8));
  // A repeated EnterEpoch does not apply any more.
  EXPECT_FALSE(rank.Enter(epoch, entry, &not_held).ok());
}

TEST(RankLife, ARelaunchedRankHoldsOnlyTheSnapshotItRestored) {
  TestJob job({"n0", "n1"}, 2);
  loom::v1::RankAssignment a = job.Launch()[2];
  a.set_attempt(2);
  a.mutable_restore()->set_source(loom::v1::RestorePlan::PEER_SNAPSHOT);
  a.mutable_restore()->set_step(5);
  a.mutable_restore()->set_peer_rank(0);
  RankLife rank(a);
  EXPECT_EQ(rank.base_step(), 5);
  EXPECT_THAT(rank.OwnSteps(5), ElementsAre(5));
  EXPECT_THAT(rank.WardSteps(5), IsEmpty());
  EXPECT_THAT(rank.WardSteps(6), ElementsAre(6));
}

// A whole recovery in place, played with the coordinator's rules: a rank
// crashes (or its node is lost), the survivors abort and report what they
// hold, the coordinator decides from those reports and sends EnterEpoch and
// the relaunch; every rank meets in the new namespace (the old tokens open
// nothing there) and completes the step after the restore step.
class InPlace : public ::testing::TestWithParam<bool /*node lost*/> {};

TEST_P(InPlace, TheRanksRecoverAsTheCoordinatorDecides) {
  const bool node_lost = GetParam();
  TestJob job({"n0", "n1", "n2", "n3"}, 2, {"spare"});
  std::vector<std::unique_ptr<RankLife>> ranks;
  for (const auto& a : job.Launch()) ranks.push_back(std::make_unique<RankLife>(a));
  Store store;
  store.Open(1, job.world());
  JobClock clock(absl::Seconds(1));
  clock.BeginAttempt(1, 0, job.world(), At(0));
  Rendezvous(Raw(ranks), store);
  Resume(Raw(ranks), clock, 0);
  for (RankLife* r : Raw(ranks)) {
    loom::v1::RankProgress p;
    r->FillStep(&p, clock.At(At(5.5)), Us(5.5));
    EXPECT_EQ(p.step(), 5);
  }

  // The failure: rank 3, or node n1 with ranks 2 and 3.
  std::set<int64_t> failed = {3};
  std::set<std::string> lost;
  if (node_lost) {
    failed = {2, 3};
    lost = {"n1"};
  }
  for (int64_t r : failed) ranks[static_cast<size_t>(r)]->Exit();
  clock.Freeze(At(5.7));

  std::map<int64_t, loom::v1::RankProgress> aborted;
  for (RankLife* r : Raw(ranks)) {
    ASSERT_TRUE(r->Abort(1, clock.At(At(5.8)).step));
    r->FillAborted(&aborted[r->rank()], Us(5.8));
  }
  absl::StatusOr<TestJob::Recovery> recovery =
      job.Recover(node_lost ? std::set<int64_t>{} : failed, lost, aborted, 5, 1);
  ASSERT_TRUE(recovery.ok()) << recovery.status();
  const coordinator::InPlaceDecision& d = recovery->decision;
  ASSERT_TRUE(d.in_place) << d.fallback_reason;
  EXPECT_EQ(d.restore_step, 5);
  EXPECT_EQ(d.steps_recomputed, 0);
  ASSERT_EQ(d.relaunched.size(), failed.size());
  for (const coordinator::Relaunch& r : d.relaunched) {
    EXPECT_EQ(r.to.node_id, node_lost ? "spare" : "n1");
  }

  // The survivors enter through their node's EnterEpoch, their own entry;
  // the new namespace holds their addresses and counts them, as the
  // coordinator opens it (job_lifecycle_in_place.cc).
  coordinator::CarriedEntries carried{.from = TestJob::Namespace(1),
                                      .survivors = std::vector<bool>(job.world(), true)};
  for (int64_t r : failed) carried.survivors[static_cast<size_t>(r)] = false;
  store.Open(2, job.world(), &carried);
  int copies_owed = 0;
  for (const auto& [node, epoch] : recovery->epochs) {
    for (const loom::v1::RankEpoch& entry : epoch.ranks()) {
      RankLife& r = *ranks[static_cast<size_t>(entry.rank())];
      std::vector<int32_t> not_held;
      ASSERT_TRUE(r.Enter(epoch, entry, &not_held).ok()) << entry.rank();
      EXPECT_THAT(not_held, IsEmpty()) << entry.rank();
      copies_owed += entry.snapshots().send_snapshot_to_size();
    }
  }
  EXPECT_EQ(copies_owed, static_cast<int>(failed.size()));
  // The relaunched ranks start from their assignment (PEER_SNAPSHOT).
  for (const coordinator::Relaunch& r : d.relaunched) {
    const loom::v1::RankAssignment& a = recovery->next[static_cast<size_t>(r.rank)];
    EXPECT_EQ(a.restore().source(), loom::v1::RestorePlan::PEER_SNAPSHOT);
    ranks[static_cast<size_t>(r.rank)] = std::make_unique<RankLife>(a);
  }
  // An old token opens nothing in the new namespace.
  loom::v1::StoreOp stale = ranks[0]->JoinOp();
  stale.set_rank_token(TestJob::Token(1, 0));
  EXPECT_EQ(store.Apply(stale).status().code(), absl::StatusCode::kPermissionDenied);

  clock.BeginAttempt(2, d.restore_step, job.world(), At(6));
  for (RankLife* r : Raw(ranks)) EXPECT_EQ(r->attempt(), 2);
  for (RankLife* r : Raw(ranks)) EXPECT_EQ(r->carried(), failed.count(r->rank()) == 0) << r->rank();
  Rendezvous(Raw(ranks), store);
  // Only the relaunched ranks wrote (an address and an add each, and the
  // last one's go); every rank's address is there.
  EXPECT_EQ(store.writes(TestJob::Namespace(2)), 2 * static_cast<int64_t>(failed.size()) + 1);
  for (int r = 0; r < job.world(); ++r) {
    EXPECT_TRUE(store.Get(TestJob::Namespace(2), rpc::RankEntryKey(r, RankLife::kAddressEntry)).ok())
        << r;
  }
  for (const loom::v1::RankProgress& p : Resume(Raw(ranks), clock, 6.5)) {
    EXPECT_EQ(p.resumed_step(), 5);
    EXPECT_EQ(p.attempt(), 2);
  }
  EXPECT_TRUE(clock.At(At(6.9)).stepping);
  for (RankLife* r : Raw(ranks)) {
    loom::v1::RankProgress p;
    if (r->FillStep(&p, clock.At(At(7.6)), Us(7.6))) clock.PastFirstStep(2, r->rank(), At(7.6));
    EXPECT_EQ(p.phase(), "step");
    EXPECT_EQ(p.step(), 6);
    EXPECT_EQ(p.attempt(), 2);
  }
  EXPECT_EQ(clock.At(At(8)).all_past_first_step, At(7.6));
}

INSTANTIATE_TEST_SUITE_P(CrashOrNodeLost, InPlace, ::testing::Bool());

}  // namespace
}  // namespace loom::loadgen
