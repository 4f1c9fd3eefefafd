// The agent's local progress endpoint (AgentService on a Unix socket): a
// stream without the token of a rank the agent runs is refused, a report for
// any rank but the token's ends the stream and is not forwarded, and the
// socket is created 0600 over a stale one (never over another file), with a
// clear error when the work dir is too long for a socket path.
#include "worker/agent/agent_service.h"

#include <sys/stat.h>

#include <fstream>
#include <map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "grpcpp/security/credentials.h"
#include "tests/agent/agent_test_util.h"
#include "tests/agent/fake_rank_tokens.h"

namespace loom::agent {
namespace {

using testing::TempDir;


class AgentServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_.ranks_["secret-0"] = RankIdentity{"job-1", 2, 0, "job-1/attempt-2", /*launch_id=*/1};
    tokens_.ranks_["secret-1"] = RankIdentity{"job-1", 2, 1, "job-1/attempt-2", /*launch_id=*/2};
    auto target = AgentSocketTarget(dir_.path());
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *target;
    auto server = StartAgentServer(target_, /*world_writable=*/false, &service_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  static loom::v1::RankProgress Report(const std::string& job, int attempt, int rank, int step) {
    loom::v1::RankProgress p;
    p.set_job_id(job);
    p.set_attempt(attempt);
    p.set_rank(rank);
    p.set_phase("step");
    p.set_step(step);
    return p;
  }
  // Streams the reports with `token` (none when empty); the call's status.
  grpc::Status Stream(const std::string& token, const std::vector<loom::v1::RankProgress>& reports) {
    auto channel = grpc::CreateChannel(target_, grpc::experimental::LocalCredentials(UDS));
    auto stub = loom::v1::AgentService::NewStub(channel);
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    loom::v1::ReportProgressResponse response;
    auto writer = stub->ReportProgress(&context, &response);
    for (const auto& r : reports) {
      if (!writer->Write(r)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  std::vector<loom::v1::RankProgress> forwarded() {
    absl::MutexLock lock(&mu_);
    return forwarded_;
  }

  TempDir dir_;
  testing::FakeRankTokens tokens_;
  absl::Mutex mu_;
  std::vector<loom::v1::RankProgress> forwarded_ ABSL_GUARDED_BY(mu_);
  AgentServiceImpl service_{&tokens_, [this](loom::v1::RankProgress p) {
                              absl::MutexLock lock(&mu_);
                              forwarded_.push_back(std::move(p));
                            }};
  std::string target_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(AgentServiceTest, TheOwnRanksReportsAreForwarded) {
  grpc::Status status = Stream("secret-1", {Report("job-1", 2, 1, 5), Report("job-1", 2, 1, 6)});
  EXPECT_TRUE(status.ok()) << status.error_message();
  const auto got = forwarded();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].step(), 5);
  EXPECT_EQ(got[1].step(), 6);
  EXPECT_EQ(got[1].rank(), 1);
}

TEST_F(AgentServiceTest, AStreamWithoutAKnownTokenIsRefused) {
  EXPECT_EQ(Stream("", {Report("job-1", 2, 0, 5)}).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Stream("secret-9", {Report("job-1", 2, 0, 5)}).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A prefix of a real token is not that token.
  EXPECT_EQ(Stream("secret-", {Report("job-1", 2, 0, 5)}).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(forwarded().empty());
}

TEST_F(AgentServiceTest, AReportForAnotherRankEndsTheStreamAndIsNotForwarded) {
  for (const auto& forged : {Report("job-1", 2, 1, 7), Report("job-1", 3, 0, 7),
                             Report("job-2", 2, 0, 7)}) {
    grpc::Status status = Stream("secret-0", {Report("job-1", 2, 0, 5), forged});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(status.error_message().find("reports only its own progress"), std::string::npos)
        << status.error_message();
  }
  for (const auto& p : forwarded()) {
    EXPECT_EQ(p.rank(), 0);
    EXPECT_EQ(p.attempt(), 2);
    EXPECT_EQ(p.job_id(), "job-1");
    EXPECT_EQ(p.step(), 5);
  }
}

TEST_F(AgentServiceTest, TheSocketIsPrivateAndAStaleOneIsReplaced) {
  const std::string path = target_.substr(5);
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // An agent that died left its socket behind: the next one replaces it.
  server_->Shutdown();
  server_.reset();
  auto again = StartAgentServer(target_, /*world_writable=*/true, &service_);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  (*again)->Shutdown();
  again->reset();
  // Anything else at the path is not the agent's to remove.
  std::filesystem::remove(path);
  std::ofstream(path) << "not a socket";
  auto refused = StartAgentServer(target_, false, &service_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("is not a socket"), std::string::npos);
}

TEST(AgentSocketTargetTest, AWorkDirTooLongForASocketPathIsRefusedNamingTheFlag) {
  EXPECT_EQ(*AgentSocketTarget("/var/lib/loom"), "unix:/var/lib/loom/agent.sock");
  auto too_long = AgentSocketTarget("/" + std::string(120, 'w'));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("--work_dir="), std::string::npos);
}

}  // namespace
}  // namespace loom::agent
