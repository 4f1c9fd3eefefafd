// NodeSession against an in-process fake NodeService: registration first,
// heartbeats after Registered, commands carried to the ranks, exits reported,
// and reconnection after a coordinator restart that leaves the ranks alive.
#include "worker/agent/node_session.h"

#include <sys/stat.h>

#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"
#include "tests/agent/fake_node_service.h"
#include "worker/agent/rank_manager.h"

namespace loom::agent {
namespace {

using loom::v1::NodeMessage;
using testing::CountKind;
using testing::FakeNodeService;
using testing::FindExit;
using testing::KillMessage;
using testing::LaunchMessage;
using testing::TempDir;

// Records commands; reports a fixed list of running ranks.
class RecordingRanks : public RankCommands {
 public:
  absl::Status Launch(const loom::v1::RankAssignment& assignment) override {
    absl::MutexLock lock(&mu_);
    launched_.push_back(assignment);
    return absl::OkStatus();
  }
  int Kill(const loom::v1::KillRanks& kill) override {
    absl::MutexLock lock(&mu_);
    killed_.push_back(kill);
    return 0;
  }
  int Abort(const loom::v1::AbortRanks&) override { return 0; }
  int Stop(const loom::v1::StopRanks&) override { return 0; }
  int EnterEpoch(const loom::v1::EnterEpoch&) override { return 0; }
  int Trace(const loom::v1::TraceStep&) override { return 0; }
  int Resume(const loom::v1::ResumeRanks&) override { return 0; }
  std::vector<loom::v1::RunningRank> Running() const override {
    loom::v1::RunningRank rank;
    rank.set_job_id("old-job");
    rank.set_attempt(4);
    rank.set_rank(1);
    rank.set_pid(4242);
    return {rank};
  }
  size_t launched() {
    absl::MutexLock lock(&mu_);
    return launched_.size();
  }
  size_t killed() {
    absl::MutexLock lock(&mu_);
    return killed_.size();
  }

 private:
  absl::Mutex mu_;
  std::vector<loom::v1::RankAssignment> launched_ ABSL_GUARDED_BY(mu_);
  std::vector<loom::v1::KillRanks> killed_ ABSL_GUARDED_BY(mu_);
};

NodeSessionOptions Options(const std::string& address) {
  NodeSessionOptions options;
  options.coordinator = address;
  options.credentials = grpc::InsecureChannelCredentials();  // the in-process fake listens plaintext
  options.registration.set_node_id("node-a");
  options.registration.set_hostname("host-a");
  options.registration.set_address("127.0.0.1");
  loom::v1::Device* device = options.registration.add_devices();
  device->set_kind("cpu");
  device->set_count(2);
  device->set_peak_flops(1e10);
  options.initial_backoff = absl::Milliseconds(50);
  options.max_backoff = absl::Milliseconds(400);
  return options;
}

// Runs a session on its own thread for the life of the object.
class SessionThread {
 public:
  SessionThread(NodeSessionOptions options, RankCommands* ranks)
      : session_(std::move(options), ranks), thread_([this] { session_.Run(); }) {}
  ~SessionThread() {
    session_.Shutdown(absl::Seconds(2));
    thread_.join();
  }
  NodeSession& session() { return session_; }

 private:
  NodeSession session_;
  std::thread thread_;
};

TEST(NodeSessionTest, RegistersFirstThenHeartbeatsAndCarriesCommands) {
  FakeNodeService server(/*heartbeat_ms=*/20);
  server.Start();
  RecordingRanks ranks;
  {
    SessionThread agent(Options(server.address()), &ranks);
    ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
      return CountKind(m, NodeMessage::kHeartbeat) >= 3;
    }));
    std::vector<NodeMessage> received = server.received();
    ASSERT_TRUE(received[0].has_register_());
    const loom::v1::RegisterNode& hello = received[0].register_();
    EXPECT_EQ(hello.node_id(), "node-a");
    EXPECT_EQ(hello.hostname(), "host-a");
    ASSERT_EQ(hello.devices_size(), 1);
    EXPECT_EQ(hello.devices(0).count(), 2);
    ASSERT_EQ(hello.running_size(), 1);
    EXPECT_EQ(hello.running(0).pid(), 4242);
    int64_t last_seq = 0;
    for (size_t i = 1; i < received.size(); ++i) {
      ASSERT_TRUE(received[i].has_heartbeat());
      EXPECT_GT(received[i].heartbeat().seq(), last_seq);
      last_seq = received[i].heartbeat().seq();
      ASSERT_EQ(received[i].heartbeat().running_size(), 1);
      EXPECT_EQ(received[i].heartbeat().running(0).job_id(), "old-job");
    }

    server.Send(LaunchMessage("j", 1, 0));
    server.Send(KillMessage("j", 1, 2.0));
    absl::Time deadline = absl::Now() + absl::Seconds(30);
    while ((ranks.launched() < 1 || ranks.killed() < 1) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(ranks.launched(), 1u);
    EXPECT_EQ(ranks.killed(), 1u);
    EXPECT_EQ(agent.session().streams_opened(), 1);
    EXPECT_EQ(agent.session().registrations(), 1);
  }
  // Shutdown half-closed the stream rather than cutting it.
  EXPECT_EQ(server.clean_goodbyes(), 1);
}

loom::v1::RankProgress Progress(int rank, int64_t step) {
  loom::v1::RankProgress p;
  p.set_job_id("j");
  p.set_attempt(1);
  p.set_rank(rank);
  p.set_phase("step");
  p.set_step(step);
  return p;
}

// The reports of one progress message, as "rank:step".
std::vector<std::string> Reports(const NodeMessage& m) {
  std::vector<std::string> out;
  for (const auto& r : m.progress().reports()) out.push_back(absl::StrCat(r.rank(), ":", r.step()));
  return out;
}

TEST(NodeSessionTest, ReportsWithinTheWindowGoInOneMessageAndBeforeAnExit) {
  FakeNodeService server(/*heartbeat_ms=*/1000);
  server.Start();
  RecordingRanks ranks;
  NodeSessionOptions options = Options(server.address());
  options.progress_batch_window = absl::Seconds(2);  // far longer than queueing 8 reports takes
  SessionThread agent(options, &ranks);
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) { return !m.empty(); }));
  for (int rank = 0; rank < 8; ++rank) agent.session().ReportProgress(Progress(rank, 3));
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
    return CountKind(m, NodeMessage::kProgress) >= 1;
  }));
  absl::SleepFor(absl::Milliseconds(100));  // nothing more is due, but let a wrong split show
  std::vector<NodeMessage> received = server.received();
  ASSERT_EQ(CountKind(received, NodeMessage::kProgress), 1);
  for (const auto& m : received) {
    if (m.has_progress()) {
      EXPECT_EQ(Reports(m), (std::vector<std::string>{"0:3", "1:3", "2:3", "3:3", "4:3", "5:3",
                                                      "6:3", "7:3"}));
    }
  }

  // A rank's last reports go before its exit, without waiting for the window.
  agent.session().ReportProgress(Progress(0, 4));
  loom::v1::RankExited exited;
  exited.set_job_id("j");
  exited.set_attempt(1);
  exited.set_rank(0);
  agent.session().ReportExit(exited);
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
    return FindExit(m, "j", 1, 0) != nullptr;
  }));
  received = server.received();
  ASSERT_GE(received.size(), 2u);
  const NodeMessage& before = received[received.size() - 2];
  ASSERT_TRUE(before.has_progress());
  EXPECT_EQ(Reports(before), (std::vector<std::string>{"0:4"}));
  EXPECT_EQ(agent.session().progress_dropped(), 0);
}

TEST(NodeSessionTest, ProgressSentOnAStreamThatBrokeIsSentAgainAfterRegistration) {
  auto server = std::make_unique<FakeNodeService>(/*heartbeat_ms=*/1000);
  const int port = server->Start();
  RecordingRanks ranks;
  NodeSessionOptions options = Options(server->address());
  options.progress_batch_window = absl::Milliseconds(10);
  SessionThread agent(options, &ranks);
  agent.session().ReportProgress(Progress(1, 7));
  ASSERT_TRUE(server->WaitFor([](const std::vector<NodeMessage>& m) {
    return CountKind(m, NodeMessage::kProgress) == 1;
  }));
  // The coordinator dies (it may have read the batch or not: the agent
  // cannot tell) and comes back.
  server->Stop();
  server.reset();
  agent.session().ReportProgress(Progress(1, 8));  // while no session is up
  server = std::make_unique<FakeNodeService>(/*heartbeat_ms=*/1000);
  ASSERT_EQ(server->Start(port), port);
  ASSERT_TRUE(server->WaitFor([](const std::vector<NodeMessage>& m) {
    int reports = 0;
    for (const auto& each : m) reports += each.progress().reports_size();
    return reports >= 2;
  }));
  std::vector<NodeMessage> received = server->received();
  ASSERT_TRUE(received[0].has_register_());
  std::vector<std::string> all;
  for (const auto& m : received) {
    for (std::string& r : Reports(m)) all.push_back(std::move(r));
  }
  // The batch of the broken stream again, then the one queued meanwhile.
  EXPECT_EQ(all, (std::vector<std::string>{"1:7", "1:8"}));
}

TEST(NodeSessionTest, WhileNoSessionIsUpTheOldestReportsAreDroppedAboveTheBound) {
  RecordingRanks ranks;
  NodeSessionOptions options = Options("127.0.0.1:1");  // nothing listens
  options.max_pending_progress = 4;
  NodeSession session(options, &ranks);
  for (int step = 1; step <= 10; ++step) session.ReportProgress(Progress(0, step));
  EXPECT_EQ(session.progress_dropped(), 6);
}

// A rank's big reports cannot make its node's session fail: a batch stops at
// rpc::kMaxProgressBatchBytes (far below the transport's 16 MiB), a report
// above rpc::kMaxProgressReportBytes is dropped, and the bytes waiting are
// bounded too.
TEST(NodeSessionTest, BatchesAndWaitingReportsAreBoundedInBytes) {
  FakeNodeService server(/*heartbeat_ms=*/1000);
  server.Start();
  RecordingRanks ranks;
  NodeSessionOptions options = Options(server.address());
  options.progress_batch_window = absl::Seconds(1);
  SessionThread agent(options, &ranks);
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) { return !m.empty(); }));
  auto big = [](int64_t step) {
    loom::v1::RankProgress p = Progress(0, step);
    p.mutable_moe()->mutable_tokens_per_expert()->Resize(7000, 1.0);  // 56 kB
    return p;
  };
  for (int step = 1; step <= 200; ++step) agent.session().ReportProgress(big(step));  // 11 MB
  loom::v1::RankProgress huge = big(0);
  huge.mutable_moe()->mutable_tokens_per_expert()->Resize(450000, 1.0);
  agent.session().ReportProgress(huge);
  EXPECT_EQ(agent.session().progress_dropped(), 1);
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
    int reports = 0;
    for (const auto& each : m) reports += each.progress().reports_size();
    return reports >= 200;
  }));
  int batches = 0;
  for (const NodeMessage& m : server.received()) {
    if (!m.has_progress()) continue;
    ++batches;
    EXPECT_LE(static_cast<int64_t>(m.ByteSizeLong()), rpc::kMaxProgressBatchBytes + 1024);
  }
  EXPECT_GE(batches, 3);

  NodeSessionOptions idle = Options("127.0.0.1:1");  // nothing listens
  idle.max_pending_progress_bytes = 1 << 20;
  NodeSession session(idle, &ranks);
  for (int step = 1; step <= 40; ++step) session.ReportProgress(big(step));  // 2.2 MB
  EXPECT_GE(session.progress_dropped(), 20);
}

TEST(NodeSessionTest, NothingButRegisterUntilRegistered) {
  // A server that never answers: the agent must not send heartbeats or exits.
  class SilentService final : public loom::v1::NodeService::Service {
   public:
    grpc::Status Session(grpc::ServerContext* context,
                         grpc::ServerReaderWriter<loom::v1::CoordinatorMessage, NodeMessage>*
                             stream) override {
      NodeMessage message;
      while (stream->Read(&message)) {
        absl::MutexLock lock(&mu);
        received.push_back(message);
      }
      return grpc::Status::OK;
    }
    absl::Mutex mu;
    std::vector<NodeMessage> received;
  } silent;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&silent);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();

  RecordingRanks ranks;
  NodeSessionOptions options = Options(absl::StrCat("127.0.0.1:", port));
  options.default_heartbeat = absl::Milliseconds(10);
  {
    SessionThread agent(options, &ranks);
    loom::v1::RankExited exited;
    exited.set_job_id("j");
    agent.session().ReportExit(exited);
    absl::MutexLock lock(&silent.mu);
    silent.mu.AwaitWithTimeout(
        absl::Condition(+[](std::vector<NodeMessage>* r) { return !r->empty(); },
                        &silent.received),
        absl::Seconds(30));
    // Give a misbehaving agent the chance to send more before looking.
    silent.mu.Unlock();
    absl::SleepFor(absl::Milliseconds(200));
    silent.mu.Lock();
    ASSERT_EQ(silent.received.size(), 1u);
    EXPECT_TRUE(silent.received[0].has_register_());
  }
  server->Shutdown(std::chrono::system_clock::now());
}

// A RankManager and a session wired together as in loom-worker. Ranks are
// stopped while the session still exists, so no report reaches a dead one.
struct Harness {
  Harness(const RankManagerOptions& options, const std::string& address)
      : ranks(options, [this](loom::v1::RankExited e) {
          if (NodeSession* s = current.load()) s->ReportExit(std::move(e));
        }),
        session(std::make_unique<SessionThread>(Options(address), &ranks)) {
    current.store(&session->session());
  }
  ~Harness() {
    ranks.Shutdown(absl::Seconds(30));
    current.store(nullptr);
    session.reset();
  }
  std::atomic<NodeSession*> current{nullptr};
  RankManager ranks;
  std::unique_ptr<SessionThread> session;
};

class SessionWithRanksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeSubreaper();
    const std::string script = dir_.path() + "/trainer.sh";
    {
      // Rank 0 ends on its own with a message; other ranks run until the file
      // "go" appears in their directory, then exit 7; rank 9 sleeps.
      std::ofstream out(script);
      out << "#!/bin/sh\n"
             "case \"$*\" in\n"
             "  */rank_0/*) echo 'trainer says bye'; exit 5 ;;\n"
             "  */rank_9/*) exec /bin/sleep 30 ;;\n"
             "esac\n"
             "while [ ! -f go ]; do /bin/sleep 0.02; done\n"
             "echo finished; exit 7\n";
    }
    chmod(script.c_str(), 0755);
    options_.work_dir = dir_.path() + "/work";
    options_.trainer_path = script;
    options_.default_grace = absl::Seconds(30);
  }

  TempDir dir_;
  RankManagerOptions options_;
};

TEST_F(SessionWithRanksTest, LaunchedRanksAreReportedWhenTheyExitOrAreKilled) {
  FakeNodeService server(/*heartbeat_ms=*/20);
  server.Start();
  Harness agent(options_, server.address());
  RankManager& ranks = agent.ranks;

  server.Send(LaunchMessage("j", 1, 0));
  server.Send(LaunchMessage("j", 1, 9));
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
    return FindExit(m, "j", 1, 0) != nullptr;
  }));
  std::vector<NodeMessage> received = server.received();
  const loom::v1::RankExited* exit0 = FindExit(received, "j", 1, 0);
  EXPECT_EQ(exit0->exit_code(), 5);
  EXPECT_EQ(exit0->log_tail(), "trainer says bye");
  EXPECT_EQ(exit0->log_path(), options_.work_dir + "/jobs/j/attempt_1/rank_0/log.txt");

  // Rank 9 shows up in heartbeats with its pid, then is killed on command.
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
    return !m.empty() && m.back().has_heartbeat() && m.back().heartbeat().running_size() == 1 &&
           m.back().heartbeat().running(0).rank() == 9;
  }));
  server.Send(KillMessage("j", 0, 30));
  ASSERT_TRUE(server.WaitFor([](const std::vector<NodeMessage>& m) {
    return FindExit(m, "j", 1, 9) != nullptr;
  }));
  received = server.received();
  EXPECT_EQ(FindExit(received, "j", 1, 9)->signal(), SIGTERM);
  ranks.Shutdown(absl::Seconds(30));
}

TEST_F(SessionWithRanksTest, CoordinatorRestartKeepsRanksAndDeliversExitsAfterReconnect) {
  auto server = std::make_unique<FakeNodeService>(/*heartbeat_ms=*/20);
  const int port = server->Start();
  Harness agent(options_, server->address());

  server->Send(LaunchMessage("j", 1, 1));
  ASSERT_TRUE(server->WaitFor([](const std::vector<NodeMessage>& m) {
    return !m.empty() && m.back().has_heartbeat() && m.back().heartbeat().running_size() == 1;
  }));
  const int32_t pid = server->received().back().heartbeat().running(0).pid();
  ASSERT_GT(pid, 0);

  // The coordinator goes away; meanwhile the rank finishes.
  server->Stop();
  server.reset();
  std::ofstream(options_.work_dir + "/jobs/j/attempt_1/rank_1/go").close();

  server = std::make_unique<FakeNodeService>(/*heartbeat_ms=*/20);
  ASSERT_EQ(server->Start(port), port);
  ASSERT_TRUE(server->WaitFor([](const std::vector<NodeMessage>& m) {
    return FindExit(m, "j", 1, 1) != nullptr;
  }));
  std::vector<NodeMessage> received = server->received();
  ASSERT_TRUE(received[0].has_register_());
  const loom::v1::RankExited* exited = FindExit(received, "j", 1, 1);
  EXPECT_EQ(exited->exit_code(), 7);
  EXPECT_NE(exited->log_tail().find("finished"), std::string::npos);
  EXPECT_GE(agent.session->session().streams_opened(), 2);
  EXPECT_EQ(agent.session->session().registrations(), 2);
}

TEST_F(SessionWithRanksTest, ReconnectReportsRanksStillRunning) {
  auto server = std::make_unique<FakeNodeService>(/*heartbeat_ms=*/20);
  const int port = server->Start();
  Harness agent(options_, server->address());
  RankManager& ranks = agent.ranks;

  server->Send(LaunchMessage("j", 3, 9));
  ASSERT_TRUE(server->WaitFor([](const std::vector<NodeMessage>& m) {
    return !m.empty() && m.back().has_heartbeat() && m.back().heartbeat().running_size() == 1;
  }));
  const int32_t pid = server->received().back().heartbeat().running(0).pid();
  server->Stop();
  server = std::make_unique<FakeNodeService>(/*heartbeat_ms=*/20);
  ASSERT_EQ(server->Start(port), port);
  ASSERT_TRUE(server->WaitFor([](const std::vector<NodeMessage>& m) {
    return !m.empty() && m[0].has_register_();
  }));
  const loom::v1::RegisterNode hello = server->received()[0].register_();
  ASSERT_EQ(hello.running_size(), 1);
  EXPECT_EQ(hello.running(0).job_id(), "j");
  EXPECT_EQ(hello.running(0).attempt(), 3);
  EXPECT_EQ(hello.running(0).rank(), 9);
  EXPECT_EQ(hello.running(0).pid(), pid);
  EXPECT_EQ(kill(pid, 0), 0);  // never touched by the restart
  ranks.Shutdown(absl::Seconds(30));
}

}  // namespace
}  // namespace loom::agent
