// A trainer's ProgressReporter against the agent's real AgentService on its
// Unix socket: reports arrive in order with the rank's token, and when the
// agent restarts (its socket goes away and comes back) the reporter
// reconnects and delivers what was queued meanwhile.
#include <set>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"
#include "worker/agent/agent_service.h"
#include "worker/trainer/progress_reporter.h"

namespace loom::agent {
namespace {

class OneRank final : public RankTokens {
 public:
  std::optional<RankIdentity> RankForToken(std::string_view token) const override {
    if (!ConstantTimeEquals(token, "the-token")) return std::nullopt;
    return Identity();
  }
  std::optional<RankIdentity> RankForLaunch(uint64_t launch_id) const override {
    if (launch_id != 1) return std::nullopt;
    return Identity();
  }

 private:
  static RankIdentity Identity() { return RankIdentity{"job-1", 3, 1, "job-1/attempt-3", 1}; }
};

class Relay {
 public:
  void Start(const std::string& target) {
    auto server = StartAgentServer(target, false, &service_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void Stop() {
    server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
  // The steps forwarded so far (duplicates kept).
  std::vector<int64_t> steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  bool WaitForStep(int64_t step) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::find(steps_.begin(), steps_.end(), step) != steps_.end();
    };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(30));
  }

 private:
  OneRank tokens_;
  absl::Mutex mu_;
  std::vector<int64_t> steps_ ABSL_GUARDED_BY(mu_);
  AgentServiceImpl service_{&tokens_, [this](loom::v1::RankProgress p) {
                              EXPECT_EQ(p.job_id(), "job-1");
                              EXPECT_EQ(p.rank(), 1);
                              absl::MutexLock lock(&mu_);
                              steps_.push_back(p.step());
                            }};
  std::unique_ptr<grpc::Server> server_;
};

loom::v1::RankProgress Step(int64_t step) {
  loom::v1::RankProgress p;
  p.set_phase("step");
  p.set_step(step);
  return p;
}

TEST(ProgressRelayTest, ReportsReachTheAgentAndSurviveAnAgentRestart) {
  testing::TempDir dir;
  const std::string target = *AgentSocketTarget(dir.path());
  Relay relay;
  relay.Start(target);
  {
    trainer::ProgressReporter reporter(target, "the-token", "job-1", 3, 1);
    for (int step = 1; step <= 3; ++step) reporter.Report(Step(step));
    ASSERT_TRUE(relay.WaitForStep(3));

    relay.Stop();  // the agent restarts; the rank trains on
    for (int step = 4; step <= 6; ++step) reporter.Report(Step(step));
    relay.Start(target);
    ASSERT_TRUE(relay.WaitForStep(6));
    EXPECT_TRUE(reporter.Flush(absl::Seconds(30)));
  }
  // Every step at least once, and the first delivery of each in order.
  std::vector<int64_t> first;
  std::set<int64_t> seen;
  for (int64_t step : relay.steps()) {
    if (seen.insert(step).second) first.push_back(step);
  }
  EXPECT_EQ(first, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

TEST(ProgressRelayTest, AWrongTokenDeliversNothing) {
  testing::TempDir dir;
  const std::string target = *AgentSocketTarget(dir.path());
  Relay relay;
  relay.Start(target);
  {
    trainer::ProgressReporter reporter(target, "not-the-token", "job-1", 3, 1);
    reporter.Report(Step(1));
    absl::SleepFor(absl::Milliseconds(300));  // time for the agent to see and refuse the stream
  }
  EXPECT_TRUE(relay.steps().empty());
  relay.Stop();
}

}  // namespace
}  // namespace loom::agent
