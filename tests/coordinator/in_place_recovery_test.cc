// In-place recovery through the JobManager (the lifecycle's in-place path and
// the scheduler's decision; docs/fault_tolerance.md, "In-place recovery"), on
// the real SQLite store, node registry and rendezvous store, with nodes that
// record what is sent to them and ranks played by the test's reports: a
// crashed rank is relaunched in its place and its survivors told to move on
// (RECOVERING, AbortRanks, their "aborted" reports, attempt n+1 stored before
// EnterEpoch and the one LaunchRank leave, RUNNING once all are ready); a hung
// culprit is killed at once and relaunched only after it exited; a lost
// node's ranks move to a spare node behind a commit fence that survives a
// coordinator restart; the abort deadline, a second failure and a survivor
// that never got its EnterEpoch fall back to the whole job; a restarted
// coordinator finishes a relaunch it finds stored and restarts the whole job
// when it finds none; paused ranks are resumed
// when current and killed when not; a survivor whose EnterEpoch was lost with
// a session gets it again; with no room left, a job that may shrink has its
// survivors write their snapshots as a checkpoint before it is re-planned.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "common/rpc/commit_gate.h"
#include "common/rpc/rank_entries.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/job_manager_harness.h"

namespace loom::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using loom::v1::CoordinatorMessage;
using loom::v1::JobState;

// Four ranks, data-parallel ZeRO-1, on two nodes of two devices; the abort
// deadline and the hang timeout as a test needs them.
constexpr char kSpec[] = R"(
name: in-place
model: {vocab_size: 256, hidden_size: 32, num_layers: 2, num_heads: 2, ffn_hidden_size: 64,
        max_seq_len: 32}
train: {steps: 50, global_batch_size: 8, micro_batch_size: 2, seq_len: 16, eval_interval: 0}
data: {train_path: corpus.txt}
parallelism: {dp: 4, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 1}
resources: {device: cpu, ranks: 4}
fault_tolerance: {max_restarts: 3, abort_timeout_s: 600, hang_timeout_s: 1, restart_backoff_s: 0}
)";

class InPlaceRecoveryTest : public testing::JobManagerHarness {
 protected:
  InPlaceRecoveryTest() : JobManagerHarness("loom_in_place_recovery") {}

  void SetUp() override {
    Start();
    for (const std::string id : {"node-a", "node-b", "node-c"}) channels_[id] = AddNode(id, 2);
  }

  // The job submitted, placed (on node-a and node-b: the first nodes that
  // hold it), every rank ready and `steps` steps reported.
  loom::v1::Job Running(const std::string& spec = kSpec, int64_t steps = 5) {
    auto submitted = jobs_->Submit(spec, "job.yaml", "", "alice");
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    jobs_->WaitIdle();
    job_ = *jobs_->Get(submitted->id(), loom::v1::JOB_VIEW_FULL);
    EXPECT_EQ(job_.state(), JobState::STARTING);
    for (int r = 0; r < 4; ++r) Report(r, "ready", 0);
    for (int64_t s = 1; s <= steps; ++s) {
      for (int r = 0; r < 4; ++r) Report(r, "step", s);
    }
    jobs_->WaitIdle();
    EXPECT_EQ(Get().state(), JobState::RUNNING);
    for (auto& [node, channel] : channels_) Take(node);
    return job_;
  }

  loom::v1::Job Get() { return *jobs_->Get(job_.id(), loom::v1::JOB_VIEW_FULL); }
  std::string NodeOf(int rank, const loom::v1::Job& job) {
    for (const auto& p : job.placement()) {
      if (p.rank() == rank) return p.node_id();
    }
    return "";
  }

  // A report of `rank` (on its node in the given attempt, by default the
  // job's): steps and aborts carry the snapshots of the last two steps, its
  // own and its ward's (the ring over two nodes of two: 0<->2, 1<->3).
  void Report(int rank, const std::string& phase, int64_t step, int32_t attempt = 0,
              const std::string& node = "") {
    loom::v1::RankProgressBatch batch;
    loom::v1::RankProgress* p = batch.add_reports();
    p->set_job_id(job_.id());
    p->set_attempt(attempt != 0 ? attempt : job_.attempt());
    p->set_rank(rank);
    p->set_phase(phase);
    p->set_step(step);
    p->set_loss(2.5);
    p->set_time_unix_ms(absl::ToUnixMillis(absl::Now()) + (++clock_));
    p->set_time_unix_us(absl::ToUnixMicros(absl::Now()));
    if (step > 0 && (phase == "step" || phase == "aborted")) {
      loom::v1::SnapshotHoldings* h = p->mutable_snapshots();
      h->add_own_steps(step - 1);
      h->add_own_steps(step);
      h->set_ward_rank((rank + 2) % 4);
      h->add_ward_steps(step - 1);
      h->add_ward_steps(step);
    }
    jobs_->OnRankProgressBatch(node.empty() ? NodeOf(rank, job_) : node, batch);
  }

  void Exit(int rank, int signal, int32_t attempt = 0, const std::string& node = "") {
    loom::v1::RankExited exit;
    exit.set_job_id(job_.id());
    exit.set_attempt(attempt != 0 ? attempt : job_.attempt());
    exit.set_rank(rank);
    exit.set_signal(signal);
    exit.set_exited_unix_us(absl::ToUnixMicros(absl::Now()));
    jobs_->OnRankExited(node.empty() ? NodeOf(rank, job_) : node, exit);
  }

  // What was sent to a node since the last call.
  std::vector<CoordinatorMessage> Take(const std::string& node) {
    std::vector<CoordinatorMessage> all = channels_.at(node)->messages();
    std::vector<CoordinatorMessage> fresh(all.begin() + static_cast<long>(taken_[node]), all.end());
    taken_[node] = all.size();
    return fresh;
  }

  // Every survivor of a crash of `failed` reports leaving step `step`.
  void SurvivorsAbort(const std::set<int>& failed, int64_t step) {
    for (int r = 0; r < 4; ++r) {
      if (failed.count(r) == 0) Report(r, "aborted", step);
    }
  }

  // node-b falls silent while node-a and node-c beat: the liveness tick
  // finds it lost, then tells the jobs.
  void LoseNodeB() {
    const absl::Time later = absl::Now() + absl::Seconds(10);
    for (const std::string node : {"node-a", "node-c"}) {
      nodes_.Heartbeat(node, channels_[node].get(), {}, later);
    }
    ASSERT_THAT(nodes_.ExpireSilent(later, absl::Seconds(5)), ElementsAre("node-b"));
    jobs_->OnNodeLost("node-b", "no heartbeat for 5s");
    jobs_->WaitIdle();
  }

  // A job that may shrink (min_ranks 2, a checkpoint directory) running on
  // node-a and node-b, which loses node-b and node-c: no free device is left
  // for ranks 2 and 3.
  void LoseTheRoomOfAShrinkingJob() {
    Running(absl::StrReplaceAll(
        kSpec, {{"restart_backoff_s: 0", "restart_backoff_s: 0, min_ranks: 2"},
                {"resources: {", "checkpoint: {dir: ck, interval: 100}\nresources: {"}}));
    const absl::Time later = absl::Now() + absl::Seconds(10);
    nodes_.Heartbeat("node-a", channels_["node-a"].get(), {}, later);
    ASSERT_THAT(nodes_.ExpireSilent(later, absl::Seconds(5)), ElementsAre("node-b", "node-c"));
    jobs_->OnNodeLost("node-c", "no heartbeat for 5s");
    jobs_->OnNodeLost("node-b", "no heartbeat for 5s");
    jobs_->WaitIdle();
  }

  // The one message of a kind in `messages`.
  static const CoordinatorMessage* Find(const std::vector<CoordinatorMessage>& messages,
                                        CoordinatorMessage::KindCase kind) {
    const CoordinatorMessage* found = nullptr;
    for (const CoordinatorMessage& m : messages) {
      if (m.kind_case() != kind) continue;
      EXPECT_EQ(found, nullptr) << "more than one message of kind " << kind;
      found = &m;
    }
    return found;
  }

  loom::v1::RegisterNode Registration(const std::string& node) {
    loom::v1::RegisterNode r;
    r.set_node_id(node);
    r.set_address("127.0.0.1");
    loom::v1::Device* d = r.add_devices();
    d->set_kind("cpu");
    d->set_count(2);
    d->set_peak_flops(1e11);
    return r;
  }
  static void AddRunning(loom::v1::RegisterNode& r, const std::string& job, int32_t attempt,
                         int32_t rank, bool paused = false) {
    loom::v1::RunningRank* running = r.add_running();
    running->set_job_id(job);
    running->set_attempt(attempt);
    running->set_rank(rank);
    running->set_pid(1000 + rank);
    running->set_paused(paused);
  }

  std::map<std::string, std::shared_ptr<testing::RecordingChannel>> channels_;
  std::map<std::string, size_t> taken_;
  loom::v1::Job job_;
  int64_t clock_ = 0;
};

TEST_F(InPlaceRecoveryTest, ACrashedRankIsRelaunchedInItsPlaceAndTheSurvivorsMoveOn) {
  const loom::v1::Job first = Running();
  ASSERT_EQ(NodeOf(0, first), "node-a");
  ASSERT_EQ(NodeOf(2, first), "node-b");
  // Each rank published its address as a rank entry in attempt 1 (the
  // namespace is in the launches, never in the job's view).
  std::string first_ns;
  for (const CoordinatorMessage& m : channels_.at("node-a")->messages()) {
    if (m.has_launch()) first_ns = m.launch().assignment().store_namespace();
  }
  ASSERT_FALSE(first_ns.empty());
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(kv_.Set(first_ns, rpc::RankEntryKey(r, "addr"),
                        "host:" + std::to_string(r))
                    .ok());
  }
  Exit(1, 9);
  jobs_->WaitIdle();
  loom::v1::Job job = Get();
  EXPECT_EQ(job.state(), JobState::RECOVERING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.crash_restarts(), 1);
  // Rank 1 is gone already: nothing to kill; each survivor's node is told.
  for (const std::string node : {"node-a", "node-b"}) {
    const std::vector<CoordinatorMessage> sent = Take(node);
    ASSERT_EQ(sent.size(), 1u) << node;
    ASSERT_TRUE(sent[0].has_abort()) << node;
    EXPECT_EQ(sent[0].abort().job_id(), job.id());
    EXPECT_EQ(sent[0].abort().attempt(), 1);
    EXPECT_THAT(sent[0].abort().reason(), HasSubstr("rank 1"));
  }
  EXPECT_TRUE(Take("node-c").empty());

  // Two survivors report; nothing is decided until the third does.
  Report(0, "aborted", 5);
  Report(2, "aborted", 5);
  jobs_->WaitIdle();
  EXPECT_EQ(Get().attempt(), 1);
  Report(3, "aborted", 6);  // it finished step 6 before it left
  jobs_->WaitIdle();

  job = Get();
  EXPECT_EQ(job.state(), JobState::RECOVERING);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.in_place_from_attempt(), 1);
  EXPECT_THAT(job.history(job.history_size() - 1).message(),
              HasSubstr("attempt 2 in place: ranks 1 relaunched on node-a; the others roll back "
                        "to their snapshots of step 5 (1 step recomputed)"));
  // The same places; node-a: rank 0's EnterEpoch and rank 1's launch.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(NodeOf(r, job), NodeOf(r, first)) << r;
  std::vector<CoordinatorMessage> a = Take("node-a");
  ASSERT_EQ(a.size(), 2u);
  const CoordinatorMessage* epoch_a = Find(a, CoordinatorMessage::kEnterEpoch);
  const CoordinatorMessage* launch = Find(a, CoordinatorMessage::kLaunch);
  ASSERT_NE(epoch_a, nullptr);
  ASSERT_NE(launch, nullptr);
  EXPECT_EQ(epoch_a->enter_epoch().from_attempt(), 1);
  EXPECT_EQ(epoch_a->enter_epoch().attempt(), 2);
  EXPECT_EQ(epoch_a->enter_epoch().restore_step(), 5);
  ASSERT_EQ(epoch_a->enter_epoch().ranks_size(), 1);
  EXPECT_EQ(epoch_a->enter_epoch().ranks(0).rank(), 0);
  const loom::v1::RankAssignment& relaunched = launch->launch().assignment();
  EXPECT_EQ(relaunched.rank(), 1);
  EXPECT_EQ(relaunched.attempt(), 2);
  EXPECT_EQ(relaunched.local_device(), first.placement(1).local_device());
  EXPECT_EQ(relaunched.restore().source(), loom::v1::RestorePlan::PEER_SNAPSHOT);
  EXPECT_EQ(relaunched.restore().peer_rank(), 3);
  EXPECT_EQ(relaunched.restore().step(), 5);
  EXPECT_EQ(relaunched.snapshots().buddy_rank(), 3);
  EXPECT_EQ(relaunched.store_namespace(), epoch_a->enter_epoch().store_namespace());
  // node-b: ranks 2 and 3 move on; rank 3 owes rank 1 its copy.
  std::vector<CoordinatorMessage> b = Take("node-b");
  ASSERT_EQ(b.size(), 1u);
  ASSERT_TRUE(b[0].has_enter_epoch());
  const loom::v1::EnterEpoch& epoch_b = b[0].enter_epoch();
  ASSERT_EQ(epoch_b.ranks_size(), 2);
  EXPECT_EQ(epoch_b.ranks(1).rank(), 3);
  EXPECT_THAT(epoch_b.ranks(1).snapshots().send_snapshot_to(), ElementsAre(1));
  // The new namespace is open and the old one gone.
  const std::string ns = epoch_b.store_namespace();
  EXPECT_TRUE(kv_.Set(ns, "k", "v").ok());
  // It holds the survivors' entries and counts them; rank 1 registers anew.
  for (int r : {0, 2, 3}) {
    EXPECT_EQ(*kv_.Get(ns, rpc::RankEntryKey(r, "addr"), absl::ZeroDuration()),
              "host:" + std::to_string(r));
  }
  EXPECT_FALSE(kv_.Get(ns, rpc::RankEntryKey(1, "addr"), absl::ZeroDuration()).ok());
  EXPECT_EQ(*kv_.Get(ns, std::string(rpc::kJoinedKey), absl::ZeroDuration()), "3");
  EXPECT_TRUE(Take("node-c").empty());

  // Every rank ready in attempt 2: RUNNING.
  job_ = job;
  for (int r = 0; r < 4; ++r) Report(r, "ready", 0);
  jobs_->WaitIdle();
  job = Get();
  EXPECT_EQ(job.state(), JobState::RUNNING);
  EXPECT_EQ(job.in_place_from_attempt(), 0);
  EXPECT_EQ(job.history(job.history_size() - 1).message(),
            "all 4 ranks joined attempt 2 in place");
  for (int r = 0; r < 4; ++r) Report(r, "resumed", 5);
  Report(0, "step", 6);
  jobs_->WaitIdle();
  job = Get();
  ASSERT_EQ(job.incidents_size(), 1);
  const loom::v1::RecoveryIncident& incident = job.incidents(0);
  EXPECT_EQ(incident.path(), "in_place");
  EXPECT_THAT(incident.relaunched_ranks(), ElementsAre(1));
  EXPECT_TRUE(incident.complete()) << incident.DebugString();
  EXPECT_GT(incident.aborted_unix_us(), 0);
  EXPECT_EQ(incident.resumed_step(), 5);
  EXPECT_EQ(incident.last_step(), 6);
  EXPECT_EQ(incident.steps_recomputed(), 1);
  EXPECT_TRUE(incident.fallback_reason().empty());
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_TRUE(jobs_->CheckInvariants().ok()) << jobs_->CheckInvariants();
}

TEST_F(InPlaceRecoveryTest, ASurvivorThatAbortedBeforeTheDeclarationIsNotAskedAgain) {
  Running();
  // Rank 2's collective failed by itself (its peer died) before the crash
  // was declared; a later report of another phase would have taken it back.
  Report(2, "aborted", 5);
  Report(3, "aborted", 5);
  Report(3, "forward_backward", 5);
  Exit(1, 9);
  jobs_->WaitIdle();
  EXPECT_EQ(Get().state(), JobState::RECOVERING);
  Report(0, "aborted", 5);
  jobs_->WaitIdle();
  EXPECT_EQ(Get().attempt(), 1) << "rank 3's abort was taken back and must come again";
  Report(3, "aborted", 5);
  jobs_->WaitIdle();
  EXPECT_EQ(Get().attempt(), 2);
  EXPECT_EQ(Get().in_place_from_attempt(), 1);
}

TEST_F(InPlaceRecoveryTest, AHungCulpritIsKilledAtOnceAndRelaunchedOnlyOnceItExited) {
  Running();
  // Rank 2 lags on the dp group: the hang's culprit.
  for (int r = 0; r < 4; ++r) {
    loom::v1::RankProgressBatch batch;
    loom::v1::RankProgress* p = batch.add_reports();
    p->set_job_id(job_.id());
    p->set_attempt(1);
    p->set_rank(r);
    p->set_phase("forward");
    p->set_step(5);
    p->set_time_unix_ms(absl::ToUnixMillis(absl::Now()) + (++clock_));
    loom::v1::GroupProgress* g = p->add_groups();
    g->set_group("dp[0,1,2,3]");
    g->set_issued(r == 2 ? 40 : 41);
    g->set_completed(40);
    jobs_->OnRankProgressBatch(NodeOf(r, job_), batch);
  }
  jobs_->CheckHealth(absl::Now() + absl::Seconds(60));
  jobs_->WaitIdle();
  EXPECT_EQ(Get().state(), JobState::RECOVERING);
  EXPECT_EQ(Get().hang_restarts(), 1);
  const std::vector<CoordinatorMessage> b = Take("node-b");
  const CoordinatorMessage* kill = Find(b, CoordinatorMessage::kKill);
  ASSERT_NE(kill, nullptr);
  EXPECT_THAT(kill->kill().ranks(), ElementsAre(2));
  EXPECT_EQ(kill->kill().attempt(), 1);
  EXPECT_LT(kill->kill().grace_seconds(), 0.01);  // at once
  EXPECT_NE(Find(b, CoordinatorMessage::kAbort), nullptr);  // rank 3 is a survivor there

  SurvivorsAbort({2}, 5);
  jobs_->WaitIdle();
  EXPECT_EQ(Get().attempt(), 1) << "rank 2 still runs: no relaunch beside it";
  Exit(2, 9);
  jobs_->WaitIdle();
  const loom::v1::Job job = Get();
  EXPECT_EQ(job.attempt(), 2);
  const std::vector<CoordinatorMessage> after = Take("node-b");
  const CoordinatorMessage* launch = Find(after, CoordinatorMessage::kLaunch);
  ASSERT_NE(launch, nullptr);
  EXPECT_EQ(launch->launch().assignment().rank(), 2);
  EXPECT_EQ(launch->launch().assignment().restore().peer_rank(), 0);
  ASSERT_EQ(job.incidents_size(), 1);
  EXPECT_EQ(job.incidents(0).kind(), "hang");
  EXPECT_EQ(job.incidents(0).path(), "in_place");
}

TEST_F(InPlaceRecoveryTest, ALostNodesRanksMoveToASpareNodeBehindAFenceThatOutlivesARestart) {
  const loom::v1::Job first = Running();
  LoseNodeB();
  EXPECT_EQ(Get().state(), JobState::RECOVERING);
  EXPECT_EQ(Get().node_restarts(), 1);
  // Its ranks are fenced by its lease, not killed; node-a's are aborted.
  const std::vector<CoordinatorMessage> a = Take("node-a");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_TRUE(a[0].has_abort());
  SurvivorsAbort({2, 3}, 5);
  jobs_->WaitIdle();
  const loom::v1::Job job = Get();
  ASSERT_EQ(job.attempt(), 2);
  EXPECT_EQ(NodeOf(2, job), "node-c");
  EXPECT_EQ(NodeOf(3, job), "node-c");
  EXPECT_EQ(NodeOf(0, job), "node-a");
  const std::vector<CoordinatorMessage> c = Take("node-c");
  ASSERT_EQ(c.size(), 2u);
  std::set<int> launched;
  std::string ns;
  for (const CoordinatorMessage& m : c) {
    ASSERT_TRUE(m.has_launch());
    const loom::v1::RankAssignment& assignment = m.launch().assignment();
    launched.insert(assignment.rank());
    EXPECT_EQ(assignment.restore().peer_rank(), assignment.rank() - 2);  // its old buddy on node-a
    ns = assignment.store_namespace();
  }
  EXPECT_EQ(launched, (std::set<int>{2, 3}));
  EXPECT_THAT(job.commit_fence_reason(),
              HasSubstr("node node-b was lost and its lease may not have run out"));
  EXPECT_GT(job.commit_fence_until_unix_ms(), absl::ToUnixMillis(absl::Now()));
  // Checkpoint commits wait out node-b's lease; other keys do not.
  const absl::StatusOr<int64_t> commit = kv_.Add(ns, rpc::CommitKey(6), 1);
  EXPECT_EQ(commit.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(commit.status().message()), HasSubstr("node node-b was lost"));
  EXPECT_TRUE(kv_.Set(ns, "rendezvous", "x").ok());

  // A restarted coordinator (its rendezvous store starts empty) reopens the
  // namespace with the same fence, and finishes the recovery.
  kv_.DropNamespace(ns);
  Start();
  EXPECT_EQ(kv_.Add(ns, rpc::CommitKey(6), 1).status().code(), absl::StatusCode::kUnavailable);
  job_ = Get();
  EXPECT_EQ(job_.state(), JobState::RECOVERING);
  for (int r = 0; r < 4; ++r) Report(r, "ready", 0);
  jobs_->WaitIdle();
  EXPECT_EQ(Get().state(), JobState::RUNNING);
}

TEST_F(InPlaceRecoveryTest, SurvivorsMissingAtTheDeadlineFallBackToTheWholeJob) {
  Running(absl::StrReplaceAll(kSpec, {{"abort_timeout_s: 600", "abort_timeout_s: 2"}}));
  Exit(1, 9);
  jobs_->WaitIdle();
  for (const std::string node : {"node-a", "node-b"}) Take(node);
  Report(0, "aborted", 5);
  Report(2, "aborted", 5);
  jobs_->CheckHealth(absl::Now());  // before the deadline: still waiting
  jobs_->WaitIdle();
  EXPECT_EQ(Get().state(), JobState::RECOVERING);
  jobs_->CheckHealth(absl::Now() + absl::Seconds(3));
  jobs_->WaitIdle();
  const loom::v1::Job job = Get();
  EXPECT_EQ(job.state(), JobState::RESTARTING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.restarts(), 1);  // counted once, when the recovery began
  ASSERT_EQ(job.incidents_size(), 1);
  EXPECT_EQ(job.incidents(0).path(), "whole_job");
  // The reason says where the missing rank was by its last report.
  EXPECT_THAT(job.incidents(0).fallback_reason(),
              ::testing::StartsWith("rank 3 did not report leaving its collectives within "
                                    "fault_tolerance.abort_timeout_s (2 s); rank 3 was in phase "
                                    "ready for "));
  EXPECT_THAT(job.history(job.history_size() - 1).message(),
              HasSubstr("gave way to restarting the whole job"));
  // Every rank of attempt 1 is killed.
  for (const std::string node : {"node-a", "node-b"}) {
    const std::vector<CoordinatorMessage> sent = Take(node);
    const CoordinatorMessage* kill = Find(sent, CoordinatorMessage::kKill);
    ASSERT_NE(kill, nullptr) << node;
    EXPECT_EQ(kill->kill().attempt(), 1);
    EXPECT_TRUE(kill->kill().ranks().empty());
  }
}

// A job with its own spares whose in-place recovery fell back to the whole
// job after a node was lost: it is placed again on the devices left (its
// spares among them) with the spares there is room for, none here, rather
// than idle until the lost node returns.
TEST_F(InPlaceRecoveryTest, AWholeRestartAfterALostNodeRunsOnItsSparesWithoutWaitingForMore) {
  Running(absl::StrReplaceAll(kSpec, {{"abort_timeout_s: 600", "abort_timeout_s: 2"},
                                      {"ranks: 4}", "ranks: 4, spares: 2}"}}));
  ASSERT_EQ(Get().spare_devices_size(), 2);
  EXPECT_EQ(Get().spare_devices(0).node_id(), "node-c");
  LoseNodeB();
  ASSERT_EQ(Get().state(), JobState::RECOVERING);
  // Rank 1 never reports leaving its collectives: the whole job restarts.
  Report(0, "aborted", 5);
  jobs_->CheckHealth(absl::Now() + absl::Seconds(3));
  jobs_->WaitIdle();
  ASSERT_EQ(Get().state(), JobState::RESTARTING);
  Exit(0, 15);
  Exit(1, 15);
  jobs_->WaitIdle();
  const loom::v1::Job job = Get();
  ASSERT_EQ(job.state(), JobState::STARTING) << job.DebugString();
  EXPECT_EQ(job.attempt(), 2);
  std::map<std::string, int> ranks_on;
  for (const auto& p : job.placement()) ++ranks_on[p.node_id()];
  EXPECT_EQ(ranks_on, (std::map<std::string, int>{{"node-a", 2}, {"node-c", 2}}));
  EXPECT_EQ(job.spare_devices_size(), 0);  // no device left to hold one
}

// No room for a lost node's ranks, and the job may shrink (min_ranks, a
// checkpoint directory): the survivors abort and report as in place, then are
// told to write their snapshots of the restore step as a checkpoint (not
// killed); once they exited, the whole job is placed again on the devices
// left. Survivors that do not finish by the deadline are killed.
TEST_F(InPlaceRecoveryTest, NoRoomForAShrinkingJobSpillsTheSnapshotsThenReplans) {
  LoseTheRoomOfAShrinkingJob();
  EXPECT_EQ(Get().state(), JobState::RECOVERING);
  const std::vector<CoordinatorMessage> aborted = Take("node-a");
  ASSERT_EQ(aborted.size(), 1u);
  EXPECT_TRUE(aborted[0].has_abort());
  SurvivorsAbort({2, 3}, 5);
  jobs_->WaitIdle();
  loom::v1::Job job = Get();
  EXPECT_EQ(job.state(), JobState::RESTARTING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_THAT(job.history(job.history_size() - 1).message(),
              HasSubstr("from its in-memory snapshots of step 5"));
  ASSERT_EQ(job.incidents_size(), 1);
  EXPECT_THAT(job.incidents(0).fallback_reason(),
              HasSubstr("the survivors write their snapshots of step 5 as a checkpoint"));
  // node-a's survivors are told to write, not killed.
  std::vector<CoordinatorMessage> sent = Take("node-a");
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_stop());
  EXPECT_EQ(sent[0].stop().attempt(), 1);
  EXPECT_EQ(sent[0].stop().spill_step(), 5);
  EXPECT_THAT(sent[0].stop().failed_ranks(), ElementsAre(2, 3));
  // Before the deadline nothing more happens; a re-registration that lists
  // them tells them again rather than killing them.
  jobs_->CheckHealth(absl::Now());
  loom::v1::RegisterNode again = Registration("node-a");
  AddRunning(again, job.id(), 1, 0);
  AddRunning(again, job.id(), 1, 1);
  jobs_->OnNodeRegistered(again);
  jobs_->WaitIdle();
  sent = Take("node-a");
  ASSERT_EQ(sent.size(), 1u) << sent[0].DebugString();
  EXPECT_EQ(sent[0].stop().spill_step(), 5);
  // They wrote and exited (kExitStopped): the job is placed again on node-a's
  // two devices, re-planned.
  for (int r : {0, 1}) {
    loom::v1::RankExited exit;
    exit.set_job_id(job.id());
    exit.set_attempt(1);
    exit.set_rank(r);
    exit.set_exit_code(6);
    jobs_->OnRankExited("node-a", exit);
  }
  jobs_->WaitIdle();
  job = Get();
  EXPECT_EQ(job.state(), JobState::STARTING) << job.history(job.history_size() - 1).message();
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.placement_size(), 2);
  bool shrank = false;
  for (const auto& event : job.history()) shrank |= event.message().find("shrinks from") != std::string::npos;
  EXPECT_TRUE(shrank) << job.DebugString();
}

TEST_F(InPlaceRecoveryTest, ASpillPastItsDeadlineKillsTheSurvivors) {
  LoseTheRoomOfAShrinkingJob();
  SurvivorsAbort({2, 3}, 5);
  jobs_->WaitIdle();
  ASSERT_EQ(Get().state(), JobState::RESTARTING);
  Take("node-a");
  jobs_->CheckHealth(absl::Now() + absl::Hours(1));
  jobs_->WaitIdle();
  const std::vector<CoordinatorMessage> sent = Take("node-a");
  const CoordinatorMessage* kill = Find(sent, CoordinatorMessage::kKill);
  ASSERT_NE(kill, nullptr);
  EXPECT_EQ(kill->kill().attempt(), 1);
  const loom::v1::Job job = Get();
  EXPECT_THAT(job.history(job.history_size() - 1).message(),
              HasSubstr("did not write their snapshots of step 5"));
}

TEST_F(InPlaceRecoveryTest, ASecondFailureWhileRecoveringRestartsTheWholeJob) {
  Running();
  Exit(1, 9);
  jobs_->WaitIdle();
  Exit(2, 9);  // a survivor dies before the decision
  jobs_->WaitIdle();
  loom::v1::Job job = Get();
  EXPECT_EQ(job.state(), JobState::RESTARTING);
  EXPECT_EQ(job.crash_restarts(), 2);
  ASSERT_EQ(job.incidents_size(), 2);
  EXPECT_TRUE(job.incidents(0).closed());
  EXPECT_FALSE(job.incidents(0).complete());
  EXPECT_EQ(job.incidents(1).fallback_reason(), "a second failure while recovering in place");
  // The late survivors' reports change nothing now.
  SurvivorsAbort({1, 2}, 5);
  jobs_->WaitIdle();
  EXPECT_EQ(Get().attempt(), 1);
}

TEST_F(InPlaceRecoveryTest, ARestartBeforeTheDecisionRestartsTheWholeJob) {
  Running();
  Exit(1, 9);
  Report(0, "aborted", 5);  // one survivor's report, lost with the coordinator
  jobs_->WaitIdle();
  ASSERT_EQ(Get().state(), JobState::RECOVERING);
  ASSERT_EQ(Get().in_place_from_attempt(), 0);
  // Nothing of attempt 2 was stored: the restarted coordinator restarts the
  // whole job, the restart counted once, the reason in the incident.
  Start();
  jobs_->WaitIdle();
  const loom::v1::Job job = Get();
  EXPECT_EQ(job.state(), JobState::RESTARTING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.crash_restarts(), 1);
  ASSERT_EQ(job.incidents_size(), 1);
  EXPECT_EQ(job.incidents(0).path(), "whole_job");
  EXPECT_EQ(job.incidents(0).fallback_reason(),
            "the coordinator restarted during the recovery, before it was decided");
}

TEST_F(InPlaceRecoveryTest, AFailureAfterTheRelaunchKillsBothAttemptsRanks) {
  Running();
  Exit(1, 9);
  jobs_->WaitIdle();
  SurvivorsAbort({1}, 5);
  jobs_->WaitIdle();
  job_ = Get();
  ASSERT_EQ(job_.attempt(), 2);
  for (const std::string node : {"node-a", "node-b"}) Take(node);
  // Rank 3 never got its EnterEpoch: it ends in attempt 1, which counts as
  // its exit from attempt 2.
  Exit(3, 9, /*attempt=*/1);
  jobs_->WaitIdle();
  const loom::v1::Job job = Get();
  EXPECT_EQ(job.state(), JobState::RESTARTING);
  ASSERT_EQ(job.incidents_size(), 2);
  EXPECT_EQ(job.incidents(1).fallback_reason(), "a second failure while recovering in place");
  // Whatever attempt each rank is in on its node, it is killed.
  const std::vector<CoordinatorMessage> b = Take("node-b");
  const CoordinatorMessage* kill = Find(b, CoordinatorMessage::kKill);
  ASSERT_NE(kill, nullptr);
  EXPECT_EQ(kill->kill().attempt(), 0);
  // Attempt 2's ranks exit (rank 0 still reported in attempt 1): placement
  // of attempt 3 may go on.
  Exit(0, 15, /*attempt=*/1);
  Exit(1, 15);
  Exit(2, 15);
  jobs_->WaitIdle();
  EXPECT_EQ(Get().attempt(), 3);
  EXPECT_EQ(Get().state(), JobState::STARTING);
}

TEST_F(InPlaceRecoveryTest, ASurvivorWhoseEnterEpochWasLostGetsItAgainAndIsNotKilled) {
  Running();
  Exit(1, 9);
  jobs_->WaitIdle();
  SurvivorsAbort({1}, 5);
  jobs_->WaitIdle();
  job_ = Get();
  ASSERT_EQ(job_.attempt(), 2);
  Take("node-b");
  // node-b's session broke before the EnterEpoch was written; its agent
  // registers again with ranks 2 and 3 still in attempt 1.
  loom::v1::RegisterNode again = Registration("node-b");
  AddRunning(again, job_.id(), 1, 2);
  AddRunning(again, job_.id(), 1, 3);
  jobs_->OnNodeRegistered(again);
  jobs_->WaitIdle();
  const std::vector<CoordinatorMessage> sent = Take("node-b");
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_enter_epoch());
  EXPECT_EQ(sent[0].enter_epoch().attempt(), 2);
  // Its first heartbeat lists them the same way: not taken for vanished.
  loom::v1::Heartbeat beat;
  *beat.mutable_running() = again.running();
  jobs_->OnNodeHeartbeat("node-b", beat);
  jobs_->WaitIdle();
  EXPECT_EQ(Get().state(), JobState::RECOVERING);
  EXPECT_TRUE(Take("node-b").empty());
}

TEST_F(InPlaceRecoveryTest, PausedRanksAreResumedWhenCurrentAndKilledOtherwise) {
  Running();
  loom::v1::RegisterNode again = Registration("node-a");
  AddRunning(again, job_.id(), 1, 0, /*paused=*/true);
  AddRunning(again, job_.id(), 1, 1, /*paused=*/false);
  AddRunning(again, "job-gone", 3, 0, /*paused=*/true);
  jobs_->OnNodeRegistered(again);
  jobs_->WaitIdle();
  std::vector<CoordinatorMessage> sent = Take("node-a");
  const CoordinatorMessage* resume = Find(sent, CoordinatorMessage::kResume);
  ASSERT_NE(resume, nullptr);
  ASSERT_EQ(resume->resume().ranks_size(), 1);
  EXPECT_EQ(resume->resume().ranks(0).rank(), 0);
  EXPECT_EQ(resume->resume().ranks(0).pid(), 1000);
  const CoordinatorMessage* kill = Find(sent, CoordinatorMessage::kKill);
  ASSERT_NE(kill, nullptr);
  EXPECT_EQ(kill->kill().job_id(), "job-gone");
  EXPECT_THAT(kill->kill().ranks(), ElementsAre(0));

  // The same from a heartbeat of a session that never broke (acks that came
  // too late): only the paused ranks are looked at.
  loom::v1::Heartbeat beat;
  loom::v1::RunningRank* running = beat.add_running();
  running->set_job_id(job_.id());
  running->set_attempt(1);
  running->set_rank(0);
  loom::v1::RunningRank* paused = beat.add_running();
  paused->set_job_id(job_.id());
  paused->set_attempt(1);
  paused->set_rank(1);
  paused->set_paused(true);
  loom::v1::RunningRank* old = beat.add_running();
  old->set_job_id(job_.id());
  old->set_attempt(0);
  old->set_rank(1);
  old->set_paused(true);
  jobs_->OnNodeHeartbeat("node-a", beat);
  jobs_->WaitIdle();
  sent = Take("node-a");
  resume = Find(sent, CoordinatorMessage::kResume);
  ASSERT_NE(resume, nullptr);
  EXPECT_EQ(resume->resume().ranks(0).rank(), 1);
  kill = Find(sent, CoordinatorMessage::kKill);
  ASSERT_NE(kill, nullptr);
  EXPECT_EQ(kill->kill().attempt(), 0);
}

TEST_F(InPlaceRecoveryTest, WithInPlaceOffACrashRestartsTheWholeJobAndSaysWhy) {
  Running(absl::StrReplaceAll(kSpec, {{"abort_timeout_s: 600", "in_place: false"}}));
  Exit(1, 9);
  jobs_->WaitIdle();
  const loom::v1::Job job = Get();
  EXPECT_EQ(job.state(), JobState::RESTARTING);
  ASSERT_EQ(job.incidents_size(), 1);
  EXPECT_EQ(job.incidents(0).path(), "whole_job");
  EXPECT_EQ(job.incidents(0).fallback_reason(),
            "in-place recovery is off (fault_tolerance.in_place: false)");
  EXPECT_EQ(Find(Take("node-a"), CoordinatorMessage::kAbort), nullptr);
}

TEST_F(InPlaceRecoveryTest, EveryPlacementCarriesTheSnapshotRing) {
  auto submitted = jobs_->Submit(kSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  jobs_->WaitIdle();
  std::map<int, int> buddy;
  for (const std::string node : {"node-a", "node-b"}) {
    for (const CoordinatorMessage& m : Take(node)) {
      ASSERT_TRUE(m.has_launch());
      const loom::v1::RankAssignment& a = m.launch().assignment();
      buddy[a.rank()] = a.snapshots().buddy_rank();
      EXPECT_EQ(a.snapshots().ward_rank(), a.snapshots().buddy_rank());  // two nodes: pairs
      EXPECT_EQ(a.restore().source(), loom::v1::RestorePlan::CHECKPOINT);
    }
  }
  EXPECT_EQ(buddy, (std::map<int, int>{{0, 2}, {1, 3}, {2, 0}, {3, 1}}));
}

}  // namespace
}  // namespace loom::coordinator
