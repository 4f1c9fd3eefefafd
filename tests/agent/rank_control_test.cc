// The ranks' control streams (rank_control.h) behind AgentService.Control on
// the agent's Unix socket: what waits for a rank is delivered in order when
// its stream opens, and later messages follow on it; a second stream of the
// same rank replaces the first (which ends ABORTED); the rank's end ends its
// stream with OK; a call without the current token of a running rank is
// refused; at most kMaxPending messages wait per rank (the oldest go).
#include "worker/agent/rank_control.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_harness.h"
#include "tests/agent/agent_test_util.h"
#include "tests/agent/fake_rank_tokens.h"
#include "worker/agent/agent_service.h"

namespace loom::agent {
namespace {

using loom::v1::RankControl;

RankControl Abort(const std::string& reason) {
  RankControl message;
  message.mutable_abort()->set_job_id("job-1");
  message.mutable_abort()->set_attempt(2);
  message.mutable_abort()->set_reason(reason);
  return message;
}

RankControl Epoch(int attempt) {
  RankControl message;
  message.mutable_enter_epoch()->set_job_id("job-1");
  message.mutable_enter_epoch()->set_from_attempt(attempt - 1);
  message.mutable_enter_epoch()->set_attempt(attempt);
  return message;
}

using testing::ControlReader;

class RankControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_.ranks_["secret-0"] = RankIdentity{"job-1", 2, 0, "job-1/attempt-2", /*launch_id=*/1};
    tokens_.ranks_["secret-1"] = RankIdentity{"job-1", 2, 1, "job-1/attempt-2", /*launch_id=*/2};
    auto target = AgentSocketTarget(dir_.path());
    ASSERT_TRUE(target.ok()) << target.status();
    auto server = StartAgentServer(*target, /*world_writable=*/false, &service_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = loom::v1::AgentService::NewStub(
        grpc::CreateChannel(*target, grpc::experimental::LocalCredentials(UDS)));
  }
  void TearDown() override {
    hub_.Close(1);
    hub_.Close(2);
    if (server_ != nullptr) server_->Shutdown();
  }
  // Polls (bounded) until the hub holds `n` attached streams.
  bool WaitAttached(size_t n) {
    for (int i = 0; i < 2000; ++i) {
      if (hub_.attached_streams() == n) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  testing::TempDir dir_;
  testing::FakeRankTokens tokens_;
  RankControlHub hub_;
  AgentServiceImpl service_{&tokens_, [](loom::v1::RankProgress) {}, nullptr, &hub_};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<loom::v1::AgentService::Stub> stub_;
};

TEST_F(RankControlTest, WhatWaitedComesFirstThenLaterMessagesInOrderUntilTheRankEnds) {
  hub_.Open(1);
  hub_.Open(2);
  hub_.Push(1, Abort("rank 3 crashed"));
  hub_.Push(2, Abort("for the other rank"));
  ControlReader call(stub_.get(), "secret-0");
  std::optional<RankControl> first = call.Next();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(first->has_abort());
  EXPECT_EQ(first->abort().reason(), "rank 3 crashed");
  hub_.Push(1, Epoch(3));
  hub_.Push(1, Epoch(4));
  std::optional<RankControl> second = call.Next();
  std::optional<RankControl> third = call.Next();
  ASSERT_TRUE(second.has_value() && third.has_value());
  EXPECT_EQ(second->enter_epoch().attempt(), 3);
  EXPECT_EQ(third->enter_epoch().attempt(), 4);
  // The rank ends: its stream ends cleanly, and nothing more is kept for it.
  hub_.Close(1);
  EXPECT_FALSE(call.Next().has_value());
  EXPECT_TRUE(call.Finish().ok());
  hub_.Push(1, Epoch(5));
  EXPECT_EQ(hub_.open_ranks(), 1u);
}

TEST_F(RankControlTest, ASecondStreamOfTheRankReplacesTheFirst) {
  hub_.Open(1);
  ControlReader old_call(stub_.get(), "secret-0");
  ASSERT_TRUE(WaitAttached(1));
  ControlReader new_call(stub_.get(), "secret-0");
  // The old stream ends once the new one holds the rank.
  grpc::Status replaced = old_call.Finish();
  EXPECT_EQ(replaced.error_code(), grpc::StatusCode::ABORTED) << replaced.error_message();
  EXPECT_EQ(hub_.attached_streams(), 1u);
  hub_.Push(1, Abort("after the replacement"));
  std::optional<RankControl> got = new_call.Next();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->abort().reason(), "after the replacement");
}

TEST_F(RankControlTest, ACallWithoutTheTokenOfARunningRankIsRefused) {
  hub_.Open(1);
  EXPECT_EQ(ControlReader(stub_.get(), "").Finish().error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(ControlReader(stub_.get(), "secret-9").Finish().error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A known token whose rank has ended (never opened here).
  EXPECT_EQ(ControlReader(stub_.get(), "secret-1").Finish().error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(hub_.attached_streams(), 0u);
}

TEST_F(RankControlTest, AtMostKMaxPendingMessagesWaitForARankAndTheOldestGo) {
  hub_.Open(1);
  const int pushed = static_cast<int>(RankControlHub::kMaxPending) + 8;
  for (int i = 0; i < pushed; ++i) hub_.Push(1, Abort(absl::StrCat("m", i)));
  EXPECT_EQ(hub_.dropped(), 8);
  ControlReader call(stub_.get(), "secret-0");
  std::vector<std::string> got;
  for (size_t i = 0; i < RankControlHub::kMaxPending; ++i) {
    std::optional<RankControl> next = call.Next();
    ASSERT_TRUE(next.has_value());
    got.push_back(next->abort().reason());
  }
  EXPECT_EQ(got.front(), "m8");
  EXPECT_EQ(got.back(), absl::StrCat("m", pushed - 1));
}

TEST(RankControlServiceTest, AnAgentWithoutAHubAnswersUnimplemented) {
  testing::TempDir dir;
  testing::FakeRankTokens tokens;
  tokens.ranks_["secret-0"] = RankIdentity{"job-1", 2, 0, "ns", 1};
  AgentServiceImpl service(&tokens, [](loom::v1::RankProgress) {});
  auto target = AgentSocketTarget(dir.path());
  ASSERT_TRUE(target.ok());
  auto server = StartAgentServer(*target, false, &service);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = loom::v1::AgentService::NewStub(
      grpc::CreateChannel(*target, grpc::experimental::LocalCredentials(UDS)));
  EXPECT_EQ(ControlReader(stub.get(), "secret-0").Finish().error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  (*server)->Shutdown();
}

}  // namespace
}  // namespace loom::agent
