// The loom-worker binary against a fake coordinator: registration with the
// measured CPU devices, ranks that die with the agent even when it is
// SIGKILLed, a clean SIGTERM stop that reports the ranks' exits, and the
// one-line usage error with exit status 2.
#include <signal.h>
#include <sys/stat.h>

#include <fstream>

#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"
#include "tests/agent/fake_node_service.h"
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
    port_ = server_.Start();
  }

  // Starts loom-worker; its stderr goes to agent.log.
  pid_t StartAgent(std::vector<std::string> extra = {}) {
    ProcessSpec spec;
    spec.argv = {LOOM_WORKER_BINARY, "--coordinator=" + server_.address(), "--devices=cpu:2",
                 "--work_dir=" + dir_.path() + "/work", "--node_id=test-node",
                 "--trainer=" + trainer_, "--kill_grace_s=30",
                 "--insecure"};  // the fake coordinator speaks plaintext
    spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
    spec.log_path = dir_.path() + "/agent.log";
    absl::StatusOr<pid_t> pid = supervisor_.Launch(spec, exits_.Callback());
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.ok() ? *pid : -1;
  }

  // Launches ranks 0..n-1 of job j and returns their pids from a heartbeat.
  std::vector<pid_t> LaunchRanks(int n) {
    for (int r = 0; r < n; ++r) server_.Send(LaunchMessage("j", 1, r));
    std::vector<pid_t> pids;
    bool seen = server_.WaitFor([&](const std::vector<NodeMessage>& m) {
      return !m.empty() && m.back().has_heartbeat() && m.back().heartbeat().running_size() == n;
    });
    EXPECT_TRUE(seen) << ReadFile(dir_.path() + "/agent.log");
    if (!seen) return pids;
    const std::vector<NodeMessage> received = server_.received();
    for (const auto& rank : received.back().heartbeat().running()) {
      pids.push_back(rank.pid());
    }
    return pids;
  }

  TempDir dir_;
  std::string trainer_;
  FakeNodeService server_{/*heartbeat_ms=*/50};
  int port_ = 0;
  testing::ExitCollector exits_;
  ProcessSupervisor supervisor_;  // after exits_: its callbacks write there
};

TEST_F(WorkerBinaryTest, RegistersMeasuredCpuDevices) {
  pid_t agent = StartAgent();
  ASSERT_TRUE(server_.WaitFor([](const std::vector<NodeMessage>& m) { return !m.empty(); }))
      << ReadFile(dir_.path() + "/agent.log");
  const loom::v1::RegisterNode hello = server_.received()[0].register_();
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
  std::vector<NodeMessage> received = server_.received();
  const loom::v1::RankExited* exited = FindExit(received, "j", 1, 0);
  ASSERT_NE(exited, nullptr) << "the rank's exit was not reported before the agent left";
  EXPECT_EQ(exited->signal(), SIGTERM);
  EXPECT_EQ(server_.clean_goodbyes(), 1);
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
  EXPECT_EQ(server_.sessions(), 0);
}

}  // namespace
}  // namespace loom::agent
