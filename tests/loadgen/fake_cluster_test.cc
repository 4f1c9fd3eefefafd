// loom-loadgen's fake nodes (tools/loadgen/fake_cluster.h) over real gRPC
// against a coordinator the test plays (fake_coordinator.h) with the real
// coordinator's own in-place rules and messages (test_job.h): a crashed rank
// and a lost node recovered in place, the lease running out and ResumeRanks,
// KillRanks of named ranks. Checks what the nodes send, never how fast.
#include "tools/loadgen/fake_cluster.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/loadgen/fake_coordinator.h"
#include "tests/loadgen/test_job.h"
#include "tools/loadgen/rank_life.h"
#include "common/rpc/rank_entries.h"

namespace loom::loadgen {
namespace {

using testing::FakeCoordinator;
using testing::TestJob;
using ::testing::UnorderedElementsAreArray;

constexpr int kGpus = 2;

std::string NodeName(int i) { return absl::StrFormat("n-%05d", i); }

class FakeClusterTest : public ::testing::Test {
 protected:
  // nodes run the job; spare nodes register too.
  void Start(int nodes, int spare, int64_t lease_ms = 60'000) {
    coordinator_ = std::make_unique<FakeCoordinator>(lease_ms);
    std::vector<std::string> job_nodes, spare_nodes;
    for (int i = 0; i < nodes; ++i) job_nodes.push_back(NodeName(i));
    for (int i = nodes; i < nodes + spare; ++i) spare_nodes.push_back(NodeName(i));
    job_ = std::make_unique<TestJob>(job_nodes, kGpus, spare_nodes);
    ClusterOptions options{.coordinator = coordinator_->address(),
                           .nodes = nodes + spare,
                           .gpus_per_node = kGpus,
                           .node_prefix = "n",
                           .insecure = true,
                           .step = absl::Milliseconds(250)};
    cluster_ = std::make_unique<FakeCluster>(options, nullptr);
    ASSERT_TRUE(cluster_->Create().ok());
    // The 1 Hz schedules in 20 slices, as loom-loadgen's driver threads run them.
    for (int t = 0; t < 2; ++t) {
      ticks_.emplace_back([this, t] {
        for (int slice = 0; ticking_; slice = (slice + 1) % 20) {
          if (t == 0) {
            cluster_->TickHeartbeats(slice, 20);
          } else {
            cluster_->TickReports(slice, 20);
          }
          absl::SleepFor(absl::Milliseconds(50));
        }
      });
    }
    ASSERT_TRUE(cluster_->Connect(absl::Seconds(30)).ok());
  }

  void TearDown() override {
    if (cluster_ != nullptr) cluster_->Shutdown();
    ticking_ = false;
    for (auto& t : ticks_) t.join();
    coordinator_.reset();
    // The cluster is left to the process's end, as loom-loadgen leaves it
    // (gRPC may hold its callbacks a little longer).
    cluster_.release();
  }

  void Send(const std::string& node, const loom::v1::CoordinatorMessage& m) {
    ASSERT_TRUE(coordinator_->Send(node, m)) << node;
  }

  void OpenAttempt(int attempt, const coordinator::CarriedEntries* carried = nullptr) {
    std::vector<std::string> tokens;
    for (int r = 0; r < job_->world(); ++r) tokens.push_back(TestJob::Token(attempt, r));
    coordinator_->OpenNamespace(TestJob::Namespace(attempt), tokens, carried);
  }

  void Launch(const loom::v1::RankAssignment& a) {
    loom::v1::CoordinatorMessage m;
    *m.mutable_launch()->mutable_assignment() = a;
    Send(a.node_id(), m);
  }

  // Attempt 1 on every node, until every rank reported step `steps`.
  void LaunchAndRun(int64_t steps) {
    OpenAttempt(1);
    for (const auto& a : job_->Launch()) Launch(a);
    ASSERT_TRUE(coordinator_->WaitFor([&]() {
      return RanksWith(coordinator_->reports(), 1, "step", steps, 0).size() ==
             static_cast<size_t>(job_->world());
    })) << "attempt 1 did not reach step "
        << steps;
  }

  // Ranks that reported phase in attempt (a step report: step >= min_step),
  // among reports[from..].
  static std::set<int32_t> RanksWith(const std::vector<FakeCoordinator::Report>& reports,
                                     int32_t attempt, const std::string& phase,
                                     int64_t min_step = 0, size_t from = 0) {
    std::set<int32_t> ranks;
    for (size_t i = from; i < reports.size(); ++i) {
      const loom::v1::RankProgress& p = reports[i].progress;
      if (p.attempt() == attempt && p.phase() == phase && p.step() >= min_step) {
        ranks.insert(p.rank());
      }
    }
    return ranks;
  }

  // The in-place recovery, as the coordinator carries it out: AbortRanks to
  // the survivors' nodes, their "aborted" reports, the decision, EnterEpoch
  // per node and the relaunches; then every rank must complete the step after
  // the restore step in attempt 2, and nothing of attempt 1 may come after.
  void RecoverInPlace(const std::set<int64_t>& failed_ranks, const std::set<std::string>& lost,
                      const std::set<int32_t>& dead) {
    std::set<std::string> survivor_nodes;
    std::set<int32_t> survivors;
    for (int r = 0; r < job_->world(); ++r) {
      if (dead.count(r) > 0) continue;
      survivors.insert(r);
      survivor_nodes.insert(job_->NodeOf(r));
    }
    const size_t before_abort = coordinator_->ReportCount();
    loom::v1::CoordinatorMessage abort;
    abort.mutable_abort()->set_job_id(TestJob::kJobId);
    abort.mutable_abort()->set_attempt(1);
    for (const std::string& node : survivor_nodes) Send(node, abort);
    ASSERT_TRUE(coordinator_->WaitFor([&]() {
      return RanksWith(coordinator_->reports(), 1, "aborted", 0, before_abort) == survivors;
    })) << "not every survivor reported aborted";

    std::map<int64_t, loom::v1::RankProgress> aborted;
    int64_t newest = 0;
    for (const FakeCoordinator::Report& r : coordinator_->Reports()) {
      if (r.progress.attempt() != 1) continue;
      newest = std::max(newest, r.progress.step());
      if (r.progress.phase() == "aborted") aborted[r.progress.rank()] = r.progress;
    }
    absl::StatusOr<TestJob::Recovery> recovery =
        job_->Recover(failed_ranks, lost, aborted, newest, 1);
    ASSERT_TRUE(recovery.ok()) << recovery.status();
    ASSERT_TRUE(recovery->decision.in_place) << recovery->decision.fallback_reason;
    const int64_t restore = recovery->decision.restore_step;
    EXPECT_GE(restore, 2);

    // As the coordinator opens an attempt placed in place: the survivors'
    // addresses carried, the join count at their number.
    coordinator::CarriedEntries carried{.from = TestJob::Namespace(1),
                                        .survivors = std::vector<bool>(job_->world(), true)};
    for (int32_t r : dead) carried.survivors[static_cast<size_t>(r)] = false;
    OpenAttempt(2, &carried);
    const size_t before_epoch = coordinator_->ReportCount();
    for (const auto& [node, epoch] : recovery->epochs) {
      loom::v1::CoordinatorMessage m;
      *m.mutable_enter_epoch() = epoch;
      Send(node, m);
    }
    std::set<int32_t> relaunched;
    for (const coordinator::Relaunch& r : recovery->decision.relaunched) {
      relaunched.insert(static_cast<int32_t>(r.rank));
      Launch(recovery->next[static_cast<size_t>(r.rank)]);
    }
    EXPECT_EQ(relaunched, dead);

    std::set<int32_t> all;
    for (int r = 0; r < job_->world(); ++r) all.insert(r);
    ASSERT_TRUE(coordinator_->WaitFor([&]() {
      const auto& reports = coordinator_->reports();
      return RanksWith(reports, 2, "ready", 0, before_epoch) == all &&
             RanksWith(reports, 2, "resumed", restore, before_epoch) == all &&
             RanksWith(reports, 2, "step", restore + 1, before_epoch) == all;
    })) << "not every rank got past the step after the restore step in attempt 2";

    for (const FakeCoordinator::Report& r : coordinator_->Reports()) {
      if (r.progress.attempt() == 2 && r.progress.phase() == "resumed") {
        EXPECT_EQ(r.progress.resumed_step(), restore) << r.progress.rank();
      }
    }
    // Only the relaunched ranks registered anew (an address and an add each,
    // and the last one's go); every rank's address is in the new namespace.
    EXPECT_EQ(coordinator_->WritesIn(TestJob::Namespace(2)),
              2 * static_cast<int64_t>(dead.size()) + 1);
    for (int r = 0; r < job_->world(); ++r) {
      EXPECT_TRUE(coordinator_
                      ->ValueIn(TestJob::Namespace(2), rpc::RankEntryKey(r, RankLife::kAddressEntry))
                      .ok())
          << r;
    }
    const std::vector<FakeCoordinator::Report> reports = coordinator_->Reports();
    for (size_t i = before_epoch; i < reports.size(); ++i) {
      EXPECT_NE(reports[i].progress.attempt(), 1)
          << "rank " << reports[i].progress.rank() << " reported " << reports[i].progress.phase()
          << " of attempt 1 after the EnterEpochs went out";
    }
    // Every node's heartbeats list its ranks in attempt 2 only.
    const size_t beats_from = coordinator_->Heartbeats().size();
    ASSERT_TRUE(coordinator_->WaitFor([&]() {
      std::set<int32_t> running;
      const auto& beats = coordinator_->heartbeats();
      std::set<std::string> seen;
      for (size_t i = beats.size(); i-- > beats_from;) {
        if (!seen.insert(beats[i].node).second) continue;  // that node's newest only
        for (const loom::v1::RunningRank& r : beats[i].heartbeat.running()) {
          if (r.attempt() != 2) return false;
          running.insert(r.rank());
        }
      }
      return running == all;
    })) << "the heartbeats do not show every rank in attempt 2";

    const ClusterStats& s = cluster_->stats();
    EXPECT_EQ(s.ranks_aborted.load(), static_cast<int64_t>(survivors.size()));
    EXPECT_EQ(s.ranks_entered.load(), static_cast<int64_t>(survivors.size()));
    EXPECT_EQ(s.restore_failures.load(), 0);
    EXPECT_EQ(s.restore_copies_missing.load(), 0);
    EXPECT_EQ(s.epoch_entries_skipped.load(), 0);
    EXPECT_EQ(s.stale_reports.load(), 0);
    EXPECT_EQ(s.rendezvous_failed.load(), 0);
    EXPECT_EQ(s.lease_expiries.load(), 0);
    EXPECT_EQ(cluster_->RanksBehind(TestJob::kJobId), 0);
    const JobClock::View clock = cluster_->Clock();
    EXPECT_EQ(clock.attempt, 2);
    EXPECT_EQ(clock.base_step, restore);
    EXPECT_NE(clock.all_past_first_step, absl::InfiniteFuture());
  }

  std::unique_ptr<FakeCoordinator> coordinator_;
  std::unique_ptr<TestJob> job_;
  std::unique_ptr<FakeCluster> cluster_;
  std::atomic<bool> ticking_{true};
  std::vector<std::thread> ticks_;
};

TEST_F(FakeClusterTest, ACrashedRankIsRelaunchedInPlace) {
  Start(4, 0);
  LaunchAndRun(2);
  ASSERT_TRUE(cluster_->CrashRank(3).ok());
  ASSERT_TRUE(coordinator_->WaitFor([&]() { return !coordinator_->exits().empty(); }));
  const loom::v1::RankExited exit = coordinator_->Exits()[0];
  EXPECT_EQ(exit.rank(), 3);
  EXPECT_EQ(exit.attempt(), 1);
  EXPECT_EQ(exit.signal(), 9);
  EXPECT_GT(exit.exited_unix_us(), 0);
  RecoverInPlace({3}, {}, {3});
  EXPECT_EQ(coordinator_->Exits().size(), 1u);
}

TEST_F(FakeClusterTest, ALostNodesRanksAreRelaunchedOnASpareNode) {
  Start(4, 1);
  LaunchAndRun(2);
  absl::StatusOr<FakeCluster::LostNode> lost = cluster_->LoseNodeOf(2);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(lost->id, NodeName(1));
  EXPECT_THAT(lost->ranks, UnorderedElementsAreArray({2, 3}));
  ASSERT_TRUE(coordinator_->WaitFor([&]() { return coordinator_->ended().count(NodeName(1)) > 0; }))
      << "the lost node's session did not end";
  RecoverInPlace({}, {NodeName(1)}, {2, 3});
  EXPECT_TRUE(coordinator_->Exits().empty());             // nobody was left to report them
  EXPECT_EQ(cluster_->stats().sessions_ended.load(), 0);  // a loss loadgen caused
}

TEST_F(FakeClusterTest, KillRanksKillsOnlyTheNamedRanks) {
  Start(2, 0);
  LaunchAndRun(1);
  loom::v1::CoordinatorMessage kill;
  kill.mutable_kill()->set_job_id(TestJob::kJobId);
  kill.mutable_kill()->set_attempt(1);
  kill.mutable_kill()->add_ranks(1);
  Send(job_->NodeOf(1), kill);
  ASSERT_TRUE(coordinator_->WaitFor([&]() { return !coordinator_->exits().empty(); }));
  const loom::v1::RankExited exit = coordinator_->Exits()[0];
  EXPECT_EQ(exit.rank(), 1);
  EXPECT_EQ(exit.signal(), 15);
  // Its node's newest heartbeat runs only rank 0.
  const size_t from = coordinator_->Heartbeats().size();
  ASSERT_TRUE(coordinator_->WaitFor([&]() {
    const auto& beats = coordinator_->heartbeats();
    for (size_t i = beats.size(); i-- > from;) {
      if (beats[i].node != job_->NodeOf(1)) continue;
      return beats[i].heartbeat.running_size() == 1 && beats[i].heartbeat.running(0).rank() == 0;
    }
    return false;
  }));
  EXPECT_EQ(coordinator_->Exits().size(), 1u);
}

// The agent's lease: a node whose heartbeats are no longer acknowledged
// pauses its ranks (reported paused, nothing of theirs sent) until
// ResumeRanks names them.
TEST_F(FakeClusterTest, ALeaseThatRunsOutPausesTheRanksUntilResumed) {
  Start(2, 0, /*lease_ms=*/1500);
  LaunchAndRun(1);
  const std::string node = job_->NodeOf(2);
  coordinator_->SetAcks(node, false);
  // Three heartbeats with both ranks paused: every batch made before the
  // pause has gone by then (one write at a time, a second apart).
  std::vector<loom::v1::RunningRank> paused;
  size_t quiet_from = 0;
  ASSERT_TRUE(coordinator_->WaitFor([&]() {
    int seen = 0;
    for (const FakeCoordinator::Beat& b : coordinator_->heartbeats()) {
      if (b.node != node || b.heartbeat.running_size() != 2 || !b.heartbeat.running(0).paused() ||
          !b.heartbeat.running(1).paused()) {
        continue;
      }
      if (++seen == 3) {
        paused.assign(b.heartbeat.running().begin(), b.heartbeat.running().end());
        quiet_from = coordinator_->reports().size();
        return true;
      }
    }
    return false;
  })) << "the lease did not pause the node's ranks";
  EXPECT_EQ(cluster_->stats().lease_expiries.load(), 1);
  EXPECT_EQ(cluster_->stats().ranks_paused.load(), 2);
  // The other node's ranks report on meanwhile; the paused ones do not.
  ASSERT_TRUE(coordinator_->WaitFor(
      [&]() { return RanksWith(coordinator_->reports(), 1, "step", 0, quiet_from).size() == 2; }));
  const std::set<int32_t> quiet = RanksWith(coordinator_->Reports(), 1, "step", 0, quiet_from);
  EXPECT_EQ(quiet.count(2) + quiet.count(3), 0u);

  coordinator_->SetAcks(node, true);
  const size_t resumed_from = coordinator_->ReportCount();
  loom::v1::CoordinatorMessage resume;
  for (const loom::v1::RunningRank& r : paused) *resume.mutable_resume()->add_ranks() = r;
  Send(node, resume);
  ASSERT_TRUE(coordinator_->WaitFor([&]() {
    const std::set<int32_t> after = RanksWith(coordinator_->reports(), 1, "step", 0, resumed_from);
    return after.count(2) > 0 && after.count(3) > 0;
  })) << "the resumed ranks do not report again";
  EXPECT_EQ(cluster_->stats().ranks_resumed.load(), 2);
}

}  // namespace
}  // namespace loom::loadgen
