// The agent's lease, end to end through the agent as loom-worker assembles
// it (agent_harness.h), against the fake coordinator, with real rank
// processes: when the coordinator stops acknowledging heartbeats the lease
// runs out, every rank is stopped (state T in /proc) and shown paused, and
// its store calls and progress are refused without reaching the coordinator,
// also once acks come again; ResumeRanks continues the ranks it names (the
// others stay paused, and a kill ends a paused rank at once); a coordinator
// that comes back within the lease pauses nothing; a lease of 0 pauses
// nothing however long the acks stay away. And, without the watcher that
// stops ranks: a rank is refused from the moment the lease has run out, and
// stays refused when it runs again, until it is resumed.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/agent/agent_harness.h"
#include "tests/agent/agent_test_util.h"
#include "tests/agent/fake_node_service.h"
#include "tests/agent/fake_rank_service.h"

namespace loom::agent {
namespace {

using loom::v1::NodeMessage;
using testing::AgentHarness;
using testing::FakeNodeService;
using testing::FakeRankService;
using testing::FindExit;
using testing::LastHeartbeat;
using testing::RankClient;

loom::v1::RankProgress Report(int rank, int64_t step) {
  loom::v1::RankProgress p;
  p.set_job_id("j");
  p.set_attempt(1);
  p.set_rank(rank);
  p.set_phase("step");
  p.set_step(step);
  return p;
}

// Whether every rank of the newest heartbeat shows `paused` (and there are n).
bool AllPaused(const std::vector<NodeMessage>& m, int n, bool paused) {
  const loom::v1::Heartbeat* beat = LastHeartbeat(m);
  if (beat == nullptr || beat->running_size() != n) return false;
  for (const auto& r : beat->running()) {
    if (r.paused() != paused) return false;
  }
  return true;
}

class LeaseFencingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeSubreaper();
    const std::string script = dir_.path() + "/trainer.sh";
    {
      std::ofstream out(script);
      out << "#!/bin/sh\nexec /bin/sleep 300\n";
    }
    chmod(script.c_str(), 0755);
    options_.work_dir = dir_.path() + "/work";
    options_.trainer_path = script;
    options_.default_grace = absl::Seconds(30);
  }

  // Launches ranks 0..n-1 of job j attempt 1; their pids by rank.
  std::map<int, pid_t> Launch(FakeNodeService& server, int n) {
    for (int rank = 0; rank < n; ++rank) server.Send(testing::LaunchMessage("j", 1, rank));
    std::map<int, pid_t> pids;
    EXPECT_TRUE(server.WaitFor([&](const std::vector<NodeMessage>& m) {
      return AllPaused(m, n, false);
    }));
    const loom::v1::Heartbeat beat = server.last_heartbeat();
    for (const auto& r : beat.running()) pids[r.rank()] = r.pid();
    return pids;
  }

  testing::TempDir dir_;
  RankManagerOptions options_;
  FakeRankService store_;
};

TEST_F(LeaseFencingTest, WithoutAcksTheRanksArePausedAndHeldUntilResumed) {
  FakeNodeService server(/*heartbeat_ms=*/50, /*lease_ms=*/1500);
  server.Start(0, &store_);
  AgentHarness agent(options_, server.address());
  std::map<int, pid_t> pids = Launch(server, 2);
  ASSERT_EQ(pids.size(), 2u);
  RankClient client(agent.target());
  ASSERT_TRUE(client.Set("j-a1-r0", "j/attempt-1", "before").ok());
  ASSERT_EQ(store_.sets(), 1);

  // The coordinator stops reading heartbeats: the lease runs out.
  server.set_acking(false);
  EXPECT_TRUE(testing::WaitStopped(pids[0], true));
  EXPECT_TRUE(testing::WaitStopped(pids[1], true));
  EXPECT_EQ(agent.lease().generation(), 1u);
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
    return AllPaused(m, 2, true);
  }));
  // Nothing of theirs is relayed: refused with UNAVAILABLE (a trainer
  // retries), and the coordinator sees none of it.
  grpc::Status set = client.Set("j-a1-r0", "j/attempt-1", "while-paused");
  EXPECT_EQ(set.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(set.error_message().find("lease ran out"), std::string::npos) << set.error_message();
  EXPECT_EQ(client.Add("j-a1-r0", "j/attempt-1", "loom/commit/4").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(client.Report("j-a1-r0", {Report(0, 9)}).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // The coordinator reads heartbeats again: the lease runs, but the ranks
  // stay paused until it names them.
  server.set_acking(true);
  for (int i = 0; i < 4000 && agent.lease().Observe().expired; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_FALSE(agent.lease().Observe().expired);
  EXPECT_EQ(client.Set("j-a1-r0", "j/attempt-1", "acked-again").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(testing::ProcState(pids[0]), 'T');

  loom::v1::RunningRank rank0;
  rank0.set_job_id("j");
  rank0.set_attempt(1);
  rank0.set_rank(0);
  rank0.set_pid(pids[0]);
  server.Send(testing::ResumeMessage({rank0}));
  EXPECT_TRUE(testing::WaitStopped(pids[0], false));
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
    const loom::v1::Heartbeat* beat = LastHeartbeat(m);
    if (beat == nullptr || beat->running_size() != 2) return false;
    for (const auto& r : beat->running()) {
      if (r.paused() != (r.rank() == 1)) return false;
    }
    return true;
  }));
  ASSERT_TRUE(client.Set("j-a1-r0", "j/attempt-1", "resumed").ok());
  ASSERT_TRUE(client.Report("j-a1-r0", {Report(0, 10)}).ok());
  EXPECT_EQ(client.Set("j-a1-r1", "j/attempt-1", "still-paused").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(testing::ProcState(pids[1]), 'T');

  const std::map<std::string, std::string> keys = store_.values();
  EXPECT_EQ(keys.count("before"), 1u);
  EXPECT_EQ(keys.count("resumed"), 1u);
  EXPECT_EQ(keys.size(), 2u);
  {
    absl::MutexLock lock(&store_.mu_);
    EXPECT_EQ(store_.adds_, 0);
  }
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
    for (const auto& each : m) {
      for (const auto& r : each.progress().reports()) {
        if (r.step() == 10) return true;
      }
    }
    return false;
  }));
  for (const auto& each : server.received()) {
    for (const auto& r : each.progress().reports()) EXPECT_NE(r.step(), 9);
  }

  // A paused rank is killed at once, whatever the grace.
  loom::v1::CoordinatorMessage kill_rank_1 = testing::KillMessage("j", 1, 3600);
  kill_rank_1.mutable_kill()->add_ranks(1);
  server.Send(kill_rank_1);
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
    return FindExit(m, "j", 1, 1) != nullptr;
  }));
  EXPECT_EQ(FindExit(server.received(), "j", 1, 1)->signal(), SIGKILL);
  EXPECT_EQ(agent.lease().generation(), 1u);
}

TEST_F(LeaseFencingTest, ACoordinatorBackWithinTheLeasePausesNothing) {
  auto server = std::make_unique<FakeNodeService>(/*heartbeat_ms=*/50, /*lease_ms=*/10'000);
  const int port = server->Start();
  AgentHarness agent(options_, server->address());
  std::map<int, pid_t> pids = Launch(*server, 1);
  ASSERT_EQ(pids.size(), 1u);

  server->Stop();
  const absl::Time down = absl::Now();
  server.reset();
  absl::SleepFor(absl::Milliseconds(300));  // the coordinator restarts
  server = std::make_unique<FakeNodeService>(/*heartbeat_ms=*/50, /*lease_ms=*/10'000);
  ASSERT_EQ(server->Start(port), port);
  ASSERT_TRUE(server->WaitFor([](const std::vector<NodeMessage>& m) {
    return !m.empty() && m[0].has_register_() && LastHeartbeat(m) != nullptr;
  }));
  std::printf("agent registered again %.2f s after the coordinator went down\n",
              absl::ToDoubleSeconds(absl::Now() - down));
  const loom::v1::RegisterNode hello = server->received()[0].register_();
  ASSERT_EQ(hello.running_size(), 1);
  EXPECT_FALSE(hello.running(0).paused());
  EXPECT_TRUE(AllPaused(server->received(), 1, false));
  EXPECT_EQ(agent.lease().generation(), 0u);
  EXPECT_NE(testing::ProcState(pids[0]), 'T');
}

TEST_F(LeaseFencingTest, ALeaseOfZeroPausesNothingWhenAcksStop) {
  FakeNodeService server(/*heartbeat_ms=*/20, /*lease_ms=*/0);
  server.Start(0, &store_);
  server.set_acking(false);
  AgentHarness agent(options_, server.address());
  std::map<int, pid_t> pids = Launch(server, 1);
  ASSERT_EQ(pids.size(), 1u);
  // Twenty more unacknowledged heartbeats.
  const size_t seen = server.received().size();
  ASSERT_TRUE(server.WaitFor([&](const std::vector<NodeMessage>& m) {
    return m.size() >= seen + 20;
  }));
  EXPECT_TRUE(AllPaused(server.received(), 1, false));
  EXPECT_EQ(agent.lease().generation(), 0u);
  EXPECT_NE(testing::ProcState(pids[0]), 'T');
  RankClient client(agent.target());
  EXPECT_TRUE(client.Set("j-a1-r0", "j/attempt-1", "k").ok());
}

TEST_F(LeaseFencingTest, ARankIsFencedFromTheRunOutOnNotFromItsStopAndStaysFencedUntilResumed) {
  // The agent's parts, without a session or a watcher: nothing stops the
  // rank, so only the fence itself can refuse its calls.
  FakeNodeService coordinator;
  coordinator.Start(0, &store_);
  Lease lease;
  RankControlHub control;
  options_.lease = &lease;
  options_.control = &control;
  std::filesystem::create_directories(options_.work_dir);
  RankManager ranks(options_, [](loom::v1::RankExited) {});
  StoreRelay relay(std::make_shared<rpc::CoordinatorChannel>(coordinator.address(),
                                                             grpc::InsecureChannelCredentials()),
                   StoreRelayOptions{}, &lease);
  AgentServiceImpl service(&ranks, [](loom::v1::RankProgress) {}, &relay, &control);
  const std::string target = *AgentSocketTarget(options_.work_dir);
  std::unique_ptr<grpc::Server> server = *StartAgentServer(target, false, &service);
  RankClient client(target);

  lease.Registered(60'000, Lease::Clock::now());
  ASSERT_TRUE(ranks.Launch(testing::LaunchMessage("j", 1, 0).launch().assignment()).ok());
  ASSERT_TRUE(client.Set("j-a1-r0", "j/attempt-1", "before").ok());

  // The lease has run out (its registration was sent long ago).
  lease.Registered(1000, Lease::Clock::now() - std::chrono::seconds(5));
  EXPECT_EQ(client.Set("j-a1-r0", "j/attempt-1", "expired").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(client.Report("j-a1-r0", {Report(0, 1)}).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // An ack renews it: the rank, launched before the run-out, stays fenced.
  lease.HeartbeatSent(1, Lease::Clock::now());
  lease.Acked(1);
  ASSERT_FALSE(lease.Observe().expired);
  EXPECT_EQ(client.Set("j-a1-r0", "j/attempt-1", "renewed").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(client.Report("j-a1-r0", {Report(0, 2)}).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  std::vector<loom::v1::RunningRank> running = ranks.Running();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_TRUE(running[0].paused());
  EXPECT_NE(testing::ProcState(running[0].pid()), 'T');  // nobody stopped it

  loom::v1::ResumeRanks resume;
  *resume.add_ranks() = running[0];
  EXPECT_EQ(ranks.Resume(resume), 1);
  EXPECT_FALSE(ranks.Running()[0].paused());
  EXPECT_TRUE(client.Set("j-a1-r0", "j/attempt-1", "resumed").ok());
  EXPECT_EQ(ranks.PauseAll(), 0);  // current again: nothing to stop

  const std::map<std::string, std::string> keys = store_.values();
  EXPECT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys.count("before") + keys.count("resumed"), 2u);
  relay.Shutdown();
  server->Shutdown();
  ranks.Shutdown(absl::Seconds(30));
}

}  // namespace
}  // namespace loom::agent
