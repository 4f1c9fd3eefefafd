// In-place recovery at the node agent, through the whole agent as
// loom-worker assembles it (agent_harness.h) against the fake coordinator,
// with real rank processes: AbortRanks and EnterEpoch reach each rank's
// control stream in order, each rank getting only its own entry; after
// EnterEpoch the old token opens nothing (progress, store, control) and the
// new one works, in the new namespace only; the rank keeps its process and
// log, shows the new attempt in heartbeats, and its exit is reported with
// it; KillRanks.ranks kills only the named ranks.
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <set>

#include "gtest/gtest.h"
#include "tests/agent/agent_harness.h"
#include "tests/agent/agent_test_util.h"
#include "tests/agent/fake_node_service.h"
#include "tests/agent/fake_rank_service.h"

namespace loom::agent {
namespace {

using loom::v1::NodeMessage;
using testing::AgentHarness;
using testing::ControlReader;
using testing::FakeNodeService;
using testing::FakeRankService;
using testing::FindExit;
using testing::LastHeartbeat;
using testing::RankClient;

loom::v1::RankProgress Report(const std::string& job, int attempt, int rank, int64_t step) {
  loom::v1::RankProgress p;
  p.set_job_id(job);
  p.set_attempt(attempt);
  p.set_rank(rank);
  p.set_phase("step");
  p.set_step(step);
  return p;
}

class InPlaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeSubreaper();
    const std::string script = dir_.path() + "/trainer.sh";
    {
      std::ofstream out(script);
      out << "#!/bin/sh\necho started\nexec /bin/sleep 300\n";
    }
    chmod(script.c_str(), 0755);
    options_.work_dir = dir_.path() + "/work";
    options_.trainer_path = script;
    options_.default_grace = absl::Seconds(30);
    server_.Start(0, &store_);
  }
  void TearDown() override { server_.Stop(); }

  // Launches ranks of job j attempt 1 and waits until a heartbeat shows them;
  // their pids by rank.
  std::map<int, pid_t> Launch(const std::vector<int>& ranks) {
    for (int rank : ranks) server_.Send(testing::LaunchMessage("j", 1, rank));
    std::map<int, pid_t> pids;
    EXPECT_TRUE(server_.WaitFor([&](const std::vector<NodeMessage>& m) {
      const loom::v1::Heartbeat* beat = LastHeartbeat(m);
      return beat != nullptr && beat->running_size() == static_cast<int>(ranks.size());
    }));
    const loom::v1::Heartbeat beat = server_.last_heartbeat();
    for (const auto& r : beat.running()) pids[r.rank()] = r.pid();
    return pids;
  }
  // Waits until the newest heartbeat shows rank `rank` in `attempt`.
  bool WaitHeartbeatAttempt(int rank, int attempt) {
    return server_.WaitFor([&](const std::vector<NodeMessage>& m) {
      const loom::v1::Heartbeat* beat = LastHeartbeat(m);
      if (beat == nullptr) return false;
      for (const auto& r : beat->running()) {
        if (r.rank() == rank && r.attempt() == attempt) return true;
      }
      return false;
    });
  }

  testing::TempDir dir_;
  RankManagerOptions options_;
  FakeRankService store_;
  FakeNodeService server_{/*heartbeat_ms=*/20};
};

TEST_F(InPlaceTest, AbortThenEnterEpochReachEachRanksControlStreamInOrderWithItsOwnEntry) {
  AgentHarness agent(options_, server_.address());
  std::map<int, pid_t> pids = Launch({0, 1});
  ASSERT_EQ(pids.size(), 2u);
  RankClient client(agent.target());
  ControlReader rank0(client.stub(), "j-a1-r0");
  ControlReader rank1(client.stub(), "j-a1-r1");
  for (int i = 0; i < 2000 && agent.control().attached_streams() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(agent.control().attached_streams(), 2u);

  server_.Send(testing::AbortMessage("j", 1));
  server_.Send(testing::EnterEpochMessage("j", 1, 2, {0, 1}));
  server_.Send(testing::EnterEpochMessage("j", 1, 2, {0, 1}));  // a repeat changes nothing
  server_.Send(testing::AbortMessage("j", 2));                 // the next recovery's

  for (int rank : {0, 1}) {
    ControlReader& reader = rank == 0 ? rank0 : rank1;
    std::optional<loom::v1::RankControl> abort = reader.Next();
    ASSERT_TRUE(abort.has_value());
    ASSERT_TRUE(abort->has_abort());
    EXPECT_EQ(abort->abort().job_id(), "j");
    EXPECT_EQ(abort->abort().attempt(), 1);
    std::optional<loom::v1::RankControl> epoch = reader.Next();
    ASSERT_TRUE(epoch.has_value());
    ASSERT_TRUE(epoch->has_enter_epoch());
    EXPECT_EQ(epoch->enter_epoch().from_attempt(), 1);
    EXPECT_EQ(epoch->enter_epoch().attempt(), 2);
    EXPECT_EQ(epoch->enter_epoch().store_namespace(), "j/attempt-2");
    EXPECT_EQ(epoch->enter_epoch().restore_step(), 7);
    // Its own entry only: no other rank's token.
    ASSERT_EQ(epoch->enter_epoch().ranks_size(), 1);
    EXPECT_EQ(epoch->enter_epoch().ranks(0).rank(), rank);
    EXPECT_EQ(epoch->enter_epoch().ranks(0).rank_token(), absl::StrCat("j-a2-r", rank));
    EXPECT_EQ(epoch->enter_epoch().ranks(0).snapshots().buddy_rank(), rank + 1);
    // The repeated EnterEpoch was not pushed again: next is attempt 2's abort.
    std::optional<loom::v1::RankControl> next = reader.Next();
    ASSERT_TRUE(next.has_value());
    ASSERT_TRUE(next->has_abort());
    EXPECT_EQ(next->abort().attempt(), 2);
  }
  // The streams lasted across the attempts; the processes are the same.
  EXPECT_EQ(agent.control().attached_streams(), 2u);
  ASSERT_TRUE(WaitHeartbeatAttempt(0, 2));
  ASSERT_TRUE(WaitHeartbeatAttempt(1, 2));
  const loom::v1::Heartbeat beat = server_.last_heartbeat();
  for (const auto& r : beat.running()) {
    EXPECT_EQ(r.pid(), pids[r.rank()]);
  }
}

TEST_F(InPlaceTest, AfterEnterEpochTheOldTokenOpensNothingAndTheNewOneWorksInTheNewNamespace) {
  AgentHarness agent(options_, server_.address());
  std::map<int, pid_t> pids = Launch({0});
  ASSERT_EQ(pids.size(), 1u);
  RankClient client(agent.target());
  ASSERT_TRUE(client.Set("j-a1-r0", "j/attempt-1", "before").ok());
  ASSERT_TRUE(client.Report("j-a1-r0", {Report("j", 1, 0, 3)}).ok());

  // A progress stream opened before the epoch, still open after it.
  grpc::ClientContext open_context;
  RankClient::Prepare(open_context, "j-a1-r0", absl::Seconds(30));
  loom::v1::ReportProgressResponse open_response;
  auto open_stream = client.stub()->ReportProgress(&open_context, &open_response);
  ASSERT_TRUE(open_stream->Write(Report("j", 1, 0, 4)));
  ASSERT_TRUE(server_.WaitFor([](const std::vector<NodeMessage>& m) {
    for (const auto& each : m) {
      for (const auto& r : each.progress().reports()) {
        if (r.step() == 4) return true;
      }
    }
    return false;
  }));

  server_.Send(testing::EnterEpochMessage("j", 1, 2, {0}));
  ASSERT_TRUE(WaitHeartbeatAttempt(0, 2));
  EXPECT_EQ(server_.last_heartbeat().running(0).pid(), pids[0]);

  // The old token: refused everywhere, before anything is relayed.
  EXPECT_EQ(client.Set("j-a1-r0", "j/attempt-1", "old").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(client.Add("j-a1-r0", "j/attempt-1", "loom/commit/8").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(client.Report("j-a1-r0", {Report("j", 1, 0, 5)}).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(ControlReader(client.stub(), "j-a1-r0").Finish().error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // The stream opened with it ends at its next report.
  open_stream->Write(Report("j", 1, 0, 6));
  open_stream->WritesDone();
  grpc::Status open_status = open_stream->Finish();
  EXPECT_EQ(open_status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(open_status.error_message().find("attempt 2"), std::string::npos)
      << open_status.error_message();

  // The new token: its own new namespace only, and reports of the new attempt.
  grpc::Status old_namespace = client.Set("j-a2-r0", "j/attempt-1", "stale");
  EXPECT_EQ(old_namespace.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(client.Set("j-a2-r0", "j/attempt-2", "after").ok());
  EXPECT_EQ(client.Report("j-a2-r0", {Report("j", 1, 0, 7)}).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(client.Report("j-a2-r0", {Report("j", 2, 0, 7)}).ok());

  const std::map<std::string, std::string> keys = store_.values();
  EXPECT_EQ(keys.count("before"), 1u);
  EXPECT_EQ(keys.count("after"), 1u);
  EXPECT_EQ(keys.count("old"), 0u);
  EXPECT_EQ(keys.count("stale"), 0u);
  {
    absl::MutexLock lock(&store_.mu_);
    EXPECT_EQ(store_.adds_, 0);
    EXPECT_EQ(store_.authorizations_.back(), "Bearer j-a2-r0");
  }
  // Forwarded: attempt 1's reports before the epoch, attempt 2's after.
  ASSERT_TRUE(server_.WaitFor([](const std::vector<NodeMessage>& m) {
    for (const auto& each : m) {
      for (const auto& r : each.progress().reports()) {
        if (r.attempt() == 2 && r.step() == 7) return true;
      }
    }
    return false;
  }));
  std::set<std::string> forwarded;
  for (const auto& each : server_.received()) {
    for (const auto& r : each.progress().reports()) {
      forwarded.insert(absl::StrCat(r.attempt(), ":", r.step()));
    }
  }
  EXPECT_EQ(forwarded, (std::set<std::string>{"1:3", "1:4", "2:7"}));

  // The same process ends: reported in attempt 2, with the log it always had.
  ASSERT_EQ(kill(pids[0], SIGTERM), 0);
  ASSERT_TRUE(server_.WaitFor([](const std::vector<NodeMessage>& m) {
    return FindExit(m, "j", 2, 0) != nullptr;
  }));
  const std::vector<NodeMessage> received = server_.received();
  const loom::v1::RankExited* exited = FindExit(received, "j", 2, 0);
  EXPECT_EQ(exited->signal(), SIGTERM);
  EXPECT_EQ(exited->log_path(), options_.work_dir + "/jobs/j/attempt_1/rank_0/log.txt");
  EXPECT_EQ(exited->log_tail(), "started");
  EXPECT_EQ(FindExit(received, "j", 1, 0), nullptr);
}

TEST_F(InPlaceTest, KillRanksWithRanksKillsOnlyThoseRanks) {
  AgentHarness agent(options_, server_.address());
  std::map<int, pid_t> pids = Launch({0, 1, 2});
  ASSERT_EQ(pids.size(), 3u);
  loom::v1::CoordinatorMessage only_rank_1 = testing::KillMessage("j", 1, 30);
  only_rank_1.mutable_kill()->add_ranks(1);
  server_.Send(only_rank_1);
  ASSERT_TRUE(server_.WaitFor([](const std::vector<NodeMessage>& m) {
    return FindExit(m, "j", 1, 1) != nullptr;
  }));
  // Every attempt (0), rank 2 only.
  loom::v1::CoordinatorMessage any_attempt = testing::KillMessage("j", 0, 30);
  any_attempt.mutable_kill()->add_ranks(2);
  server_.Send(any_attempt);
  ASSERT_TRUE(server_.WaitFor([](const std::vector<NodeMessage>& m) {
    return FindExit(m, "j", 1, 2) != nullptr;
  }));
  EXPECT_EQ(FindExit(server_.received(), "j", 1, 1)->signal(), SIGTERM);
  ASSERT_TRUE(server_.WaitFor([](const std::vector<NodeMessage>& m) {
    const loom::v1::Heartbeat* beat = LastHeartbeat(m);
    return beat != nullptr && beat->running_size() == 1;
  }));
  EXPECT_EQ(server_.last_heartbeat().running(0).rank(), 0);
  EXPECT_EQ(kill(pids[0], 0), 0);
  EXPECT_EQ(FindExit(server_.received(), "j", 1, 0), nullptr);
}

}  // namespace
}  // namespace loom::agent
