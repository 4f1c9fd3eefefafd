// The loom-worker binary against a fake coordinator: registration with the
// measured CPU devices, ranks that die with the agent even when it is
// SIGKILLed, a clean SIGTERM stop that reports the ranks' exits, the
// one-line usage error with exit status 2, and an agent frozen (SIGSTOP)
// past its lease that, once continued, relays nothing its ranks sent it
// meanwhile and pauses them until the coordinator resumes them.
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <thread>

#include "gtest/gtest.h"
#include "tests/agent/agent_harness.h"
#include "tests/agent/agent_test_util.h"
#include "tests/agent/fake_node_service.h"
#include "tests/agent/fake_rank_service.h"
#include "worker/agent/process_supervisor.h"

namespace loom::agent {
namespace {

using loom::v1::NodeMessage;
using testing::FakeNodeService;
using testing::FindExit;
using testing::LaunchMessage;
using testing::ReadFile;
using testing::TempDir;

class WorkerBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeSubreaper();
    trainer_ = dir_.path() + "/trainer.sh";
    {
      std::ofstream out(trainer_);
      out << "#!/bin/sh\necho \"trainer $*\"\nexec /bin/sleep 60\n";
    }
    chmod(trainer_.c_str(), 0755);
    server_ = std::make_unique<FakeNodeService>(/*heartbeat_ms=*/50, lease_ms_);
    port_ = server_->Start(0, &store_);
  }
  void TearDown() override { server_->Stop(); }

  // Starts loom-worker; its stderr goes to agent.log.
  pid_t StartAgent(std::vector<std::string> extra = {}) {
    ProcessSpec spec;
    spec.argv = {LOOM_WORKER_BINARY, "--coordinator=" + server_->address(), "--devices=cpu:2",
                 "--work_dir=" + dir_.path() + "/work", "--node_id=test-node",
                 // The fake trainer has no control channel to stop on:
                 // SIGTERM stops its ranks at once, as before draining.
                 "--trainer=" + trainer_, "--kill_grace_s=30", "--drain_grace_s=0",
                 "--insecure"};  // the fake coordinator speaks plaintext
    spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
    spec.log_path = dir_.path() + "/agent.log";
    absl::StatusOr<pid_t> pid = supervisor_.Launch(spec, exits_.Callback());
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.ok() ? *pid : -1;
  }

  // Launches ranks 0..n-1 of job j and returns their pids from a heartbeat.
  std::vector<pid_t> LaunchRanks(int n) {
    for (int r = 0; r < n; ++r) server_->Send(LaunchMessage("j", 1, r));
    std::vector<pid_t> pids;
    bool seen = server_->WaitFor([&](const std::vector<NodeMessage>& m) {
      return !m.empty() && m.back().has_heartbeat() && m.back().heartbeat().running_size() == n;
    });
    EXPECT_TRUE(seen) << ReadFile(dir_.path() + "/agent.log");
    if (!seen) return pids;
    const std::vector<NodeMessage> received = server_->received();
    for (const auto& rank : received.back().heartbeat().running()) {
      pids.push_back(rank.pid());
    }
    return pids;
  }

  TempDir dir_;
  std::string trainer_;
  int64_t lease_ms_ = 0;  // Registered.lease_ms
  testing::FakeRankService store_;  // before server_: it serves this
  std::unique_ptr<FakeNodeService> server_;
  int port_ = 0;
  testing::ExitCollector exits_;
  ProcessSupervisor supervisor_;  // after exits_: its callbacks write there
};

TEST_F(WorkerBinaryTest, RegistersMeasuredCpuDevices) {
  pid_t agent = StartAgent();
  ASSERT_TRUE(server_->WaitFor([](const std::vector<NodeMessage>& m) { return !m.empty(); }))
      << ReadFile(dir_.path() + "/agent.log");
  const loom::v1::RegisterNode hello = server_->received()[0].register_();
  EXPECT_EQ(hello.node_id(), "test-node");
  EXPECT_EQ(hello.address(), "127.0.0.1");
  EXPECT_FALSE(hello.hostname().empty());
  ASSERT_EQ(hello.devices_size(), 1);
  EXPECT_EQ(hello.devices(0).kind(), "cpu");
  EXPECT_EQ(hello.devices(0).count(), 2);
  EXPECT_GT(hello.devices(0).memory_bytes(), 0);
  EXPECT_GT(hello.devices(0).peak_flops(), 0);
  EXPECT_EQ(hello.running_size(), 0);
  kill(agent, SIGTERM);
  std::optional<ProcessExit> exit = exits_.Wait(agent);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_EQ(exit->signal, 0);
}

TEST_F(WorkerBinaryTest, RanksDieWhenTheAgentIsKilled) {
  pid_t agent = StartAgent();
  std::vector<pid_t> ranks = LaunchRanks(2);
  ASSERT_EQ(ranks.size(), 2u);
  const std::string rank_dir = dir_.path() + "/work/jobs/j/attempt_1/rank_1";
  EXPECT_TRUE(testing::WaitForFileContains(rank_dir + "/log.txt",
                                           "trainer --assignment=" + rank_dir + "/assignment.pb"));

  kill(agent, SIGKILL);
  std::optional<ProcessExit> exit = exits_.Wait(agent);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
  for (pid_t rank : ranks) {
    testing::GoneResult gone = testing::WaitGone(rank);
    if (!gone.gone) testing::KillAndReap(rank);
    EXPECT_TRUE(gone.gone) << "rank pid " << rank << " outlived its agent";
  }
}

TEST_F(WorkerBinaryTest, SigtermStopsRanksReportsThemAndExitsZero) {
  pid_t agent = StartAgent();
  std::vector<pid_t> ranks = LaunchRanks(1);
  ASSERT_EQ(ranks.size(), 1u);
  kill(agent, SIGTERM);
  std::optional<ProcessExit> exit = exits_.Wait(agent);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0) << ReadFile(dir_.path() + "/agent.log");
  std::vector<NodeMessage> received = server_->received();
  const loom::v1::RankExited* exited = FindExit(received, "j", 1, 0);
  ASSERT_NE(exited, nullptr) << "the rank's exit was not reported before the agent left";
  EXPECT_EQ(exited->signal(), SIGTERM);
  EXPECT_EQ(server_->clean_goodbyes(), 1);
  testing::GoneResult gone = testing::WaitGone(ranks[0]);
  if (!gone.gone) testing::KillAndReap(ranks[0]);
  EXPECT_TRUE(gone.gone);
}

TEST_F(WorkerBinaryTest, BadFlagIsAOneLineUsageErrorWithStatus2) {
  pid_t agent = StartAgent({"--devices=cpu:zero"});
  std::optional<ProcessExit> exit = exits_.Wait(agent);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 2);
  std::string log = ReadFile(dir_.path() + "/agent.log");
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  EXPECT_NE(log.find("--devices=cpu:zero"), std::string::npos) << log;
  EXPECT_NE(log.find("usage: loom-worker"), std::string::npos) << log;
  EXPECT_EQ(server_->sessions(), 0);
}

class FrozenAgentTest : public WorkerBinaryTest {
 protected:
  FrozenAgentTest() { lease_ms_ = 1500; }
};

TEST_F(FrozenAgentTest, AContinuedAgentRelaysNothingItsRanksSentWhileItWasFrozen) {
  pid_t agent = StartAgent();
  std::vector<pid_t> ranks = LaunchRanks(1);
  ASSERT_EQ(ranks.size(), 1u);
  const std::string token = "j-a1-r0";
  const std::string ns = "j/attempt-1";
  testing::RankClient client("unix:" + dir_.path() + "/work/agent.sock");
  ASSERT_TRUE(client.Set(token, ns, "before").ok()) << ReadFile(dir_.path() + "/agent.log");

  // The agent freezes (its ranks run on); meanwhile its rank calls it: a
  // set, a checkpoint commit's add and a report wait in the agent's socket.
  ASSERT_EQ(kill(agent, SIGSTOP), 0);
  ASSERT_TRUE(testing::WaitStopped(agent, true));
  grpc::Status set;
  grpc::Status add;
  grpc::Status report;
  std::thread calls([&] {
    std::thread set_call([&] { set = client.Set(token, ns, "while-frozen", absl::Seconds(60)); });
    std::thread add_call([&] { add = client.Add(token, ns, "loom/commit/8"); });
    loom::v1::RankProgress progress;
    progress.set_job_id("j");
    progress.set_attempt(1);
    progress.set_rank(0);
    progress.set_step(8);
    report = client.Report(token, {progress});
    set_call.join();
    add_call.join();
  });
  // Longer than the lease: the coordinator may have declared the node lost.
  absl::SleepFor(absl::Milliseconds(2 * lease_ms_));
  EXPECT_EQ(kill(agent, SIGCONT), 0);
  calls.join();
  EXPECT_EQ(set.error_code(), grpc::StatusCode::UNAVAILABLE) << set.error_message();
  EXPECT_EQ(add.error_code(), grpc::StatusCode::UNAVAILABLE) << add.error_message();
  EXPECT_EQ(report.error_code(), grpc::StatusCode::UNAVAILABLE) << report.error_message();
  // Its rank is paused, and says so, though the coordinator acks again.
  EXPECT_TRUE(testing::WaitStopped(ranks[0], true));
  ASSERT_TRUE(server_->WaitFor([](const std::vector<NodeMessage>& m) {
    const loom::v1::Heartbeat* beat = testing::LastHeartbeat(m);
    return beat != nullptr && beat->running_size() == 1 && beat->running(0).paused();
  }));
  const std::map<std::string, std::string> keys = store_.values();
  EXPECT_EQ(keys.count("while-frozen"), 0u);
  {
    absl::MutexLock lock(&store_.mu_);
    EXPECT_EQ(store_.adds_, 0);
  }
  for (const auto& each : server_->received()) EXPECT_EQ(each.progress().reports_size(), 0);

  // Resumed by the coordinator: it relays again.
  loom::v1::CoordinatorMessage resume;
  *resume.mutable_resume()->add_ranks() = server_->last_heartbeat().running(0);
  server_->Send(resume);
  EXPECT_TRUE(testing::WaitStopped(ranks[0], false));
  EXPECT_TRUE(client.Set(token, ns, "after").ok());
  EXPECT_EQ(store_.values().count("after"), 1u);
  EXPECT_NE(ReadFile(dir_.path() + "/agent.log").find("lease of 1500 ms ran out"),
            std::string::npos);

  kill(agent, SIGTERM);
  std::optional<ProcessExit> exit = exits_.Wait(agent);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0) << ReadFile(dir_.path() + "/agent.log");
}

}  // namespace
}  // namespace loom::agent
