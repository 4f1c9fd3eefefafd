// The agent's store relay (store_relay.h) behind AgentService, against a fake
// coordinator (an in-process RankService on loopback): calls with a foreign
// token or another rank's namespace are refused before anything goes
// upstream; two local gets of one key share one upstream call and both get
// the value; a waiter whose deadline passes gets DEADLINE_EXCEEDED while the
// other still gets the value, from a new upstream get when the shared one
// ended without it; sets and adds made while a StoreBatch is in flight go
// together in the next one, each answered with its own result; a set is
// retried through UNAVAILABLE and an add never is (also when they shared
// the batch that failed); every op carries the calling rank's token; a call
// admitted before the agent's lease ran out is never sent after it (a queued
// set or add, a get's next upstream call), even once the lease runs again.
#include "worker/agent/store_relay.h"

#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "gtest/gtest.h"
#include "loom/v1/rank.grpc.pb.h"
#include "tests/agent/agent_test_util.h"
#include "tests/agent/fake_rank_service.h"
#include "tests/agent/fake_rank_tokens.h"
#include "worker/agent/agent_service.h"

namespace loom::agent {
namespace {

using testing::TempDir;
using testing::FakeRankService;

constexpr char kNamespace[] = "job-1/2";

class StoreRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_.ranks_["secret-0"] = RankIdentity{"job-1", 2, 0, kNamespace};
    tokens_.ranks_["secret-1"] = RankIdentity{"job-1", 2, 1, kNamespace};
    tokens_.ranks_["other-job"] = RankIdentity{"job-9", 1, 0, "job-9/1"};
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&coordinator_);
    coordinator_server_ = builder.BuildAndStart();
    ASSERT_NE(coordinator_server_, nullptr);
    StoreRelayOptions options;
    options.initial_backoff = absl::Milliseconds(10);
    options.max_pending_per_rank = 4;
    relay_ = std::make_unique<StoreRelay>(
        std::make_shared<rpc::CoordinatorChannel>(absl::StrCat("127.0.0.1:", port),
                                                  grpc::InsecureChannelCredentials()),
        options, &lease_);
    service_ = std::make_unique<AgentServiceImpl>(
        &tokens_, [](loom::v1::RankProgress) {}, relay_.get());
    expiry_ = std::thread([this] {
      while (!stop_expiry_.HasBeenNotified()) {
        coordinator_.ExpireParked();
        stop_expiry_.WaitForNotificationWithTimeout(absl::Milliseconds(10));
      }
    });
    auto target = AgentSocketTarget(dir_.path());
    ASSERT_TRUE(target.ok()) << target.status();
    auto server = StartAgentServer(*target, /*world_writable=*/false, service_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    agent_server_ = *std::move(server);
    agent_ = loom::v1::AgentService::NewStub(
        grpc::CreateChannel(*target, grpc::experimental::LocalCredentials(UDS)));
  }
  void TearDown() override {
    if (relay_ != nullptr) relay_->Shutdown();
    if (agent_server_ != nullptr) agent_server_->Shutdown();
    stop_expiry_.Notify();
    if (expiry_.joinable()) expiry_.join();
    coordinator_.ReleaseHeld();
    coordinator_.FinishParked();
    if (coordinator_server_ != nullptr) coordinator_server_->Shutdown();
  }

  static std::unique_ptr<grpc::ClientContext> Context(const std::string& token,
                                                      absl::Duration timeout = absl::Seconds(20)) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }
  grpc::Status Set(const std::string& token, const std::string& ns, const std::string& key,
                   const std::string& value) {
    loom::v1::StoreSetRequest request;
    request.set_store_namespace(ns);
    request.set_key(key);
    request.set_value(value);
    loom::v1::StoreSetResponse response;
    return agent_->StoreSet(Context(token).get(), request, &response);
  }
  grpc::Status Get(const std::string& token, const std::string& key, absl::Duration wait,
                   std::string* value) {
    loom::v1::StoreGetRequest request;
    request.set_store_namespace(kNamespace);
    request.set_key(key);
    request.set_wait_ms(absl::ToInt64Milliseconds(wait));
    loom::v1::StoreGetResponse response;
    grpc::Status status =
        agent_->StoreGet(Context(token, wait + absl::Seconds(5)).get(), request, &response);
    *value = response.value();
    return status;
  }
  grpc::Status Add(const std::string& token, const std::string& key, int64_t delta,
                   int64_t* value) {
    loom::v1::StoreAddRequest request;
    request.set_store_namespace(kNamespace);
    request.set_key(key);
    request.set_delta(delta);
    loom::v1::StoreAddResponse response;
    grpc::Status status = agent_->StoreAdd(Context(token).get(), request, &response);
    *value = response.value();
    return status;
  }
  // Polls (bounded) until the fake coordinator holds n waiting gets.
  bool WaitParked(int n) {
    for (int i = 0; i < 1000; ++i) {
      if (coordinator_.parked() >= n) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // Makes the lease run out (registered long ago), then run again (an ack):
  // generation 1, in which no call admitted so far may go.
  void ExpireThenRenewLease() {
    lease_.Registered(1000, Lease::Clock::now() - std::chrono::seconds(5));
    ASSERT_TRUE(lease_.Observe().expired);
    lease_.HeartbeatSent(1, Lease::Clock::now());
    lease_.Acked(1);
    ASSERT_FALSE(lease_.Observe().expired);
    ASSERT_EQ(lease_.generation(), 1u);
  }

  TempDir dir_;
  Lease lease_;  // none until a test registers one: never fenced
  testing::FakeRankTokens tokens_;
  FakeRankService coordinator_;
  std::unique_ptr<grpc::Server> coordinator_server_;
  std::unique_ptr<StoreRelay> relay_;
  std::unique_ptr<AgentServiceImpl> service_;
  std::unique_ptr<grpc::Server> agent_server_;
  std::unique_ptr<loom::v1::AgentService::Stub> agent_;
  absl::Notification stop_expiry_;
  std::thread expiry_;
};

TEST_F(StoreRelayTest, AForeignTokenOrAnotherRanksNamespaceIsRefusedAndNotRelayed) {
  grpc::Status none = Set("", kNamespace, "k", "v");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::PERMISSION_DENIED) << none.error_message();
  grpc::Status foreign = Set("not-a-rank-token", kNamespace, "k", "v");
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // A rank of this agent, but of another job: not this namespace.
  grpc::Status other = Set("other-job", kNamespace, "k", "v");
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(other.error_message().find("store_namespace 'job-1/2'"), std::string::npos)
      << other.error_message();
  std::string value;
  grpc::Status get = Get("other-job", "k", absl::Milliseconds(10), &value);
  EXPECT_EQ(get.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  absl::MutexLock lock(&coordinator_.mu_);
  EXPECT_EQ(coordinator_.sets_ + coordinator_.gets_, 0);
}

TEST_F(StoreRelayTest, AKeyOrValueTheCoordinatorWouldRefuseIsRefusedHere) {
  grpc::Status big = Set("secret-0", kNamespace, std::string(2000, 'k'), "v");
  EXPECT_EQ(big.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << big.error_message();
  EXPECT_NE(big.error_message().find("at most 1024"), std::string::npos) << big.error_message();
  grpc::Status empty = Set("secret-0", kNamespace, "", "v");
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status huge = Set("secret-0", kNamespace, "k", std::string((1 << 20) + 1, 'v'));
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << huge.error_message();
  absl::MutexLock lock(&coordinator_.mu_);
  EXPECT_EQ(coordinator_.sets_, 0);
}

TEST_F(StoreRelayTest, TwoGetsOfOneKeyShareOneUpstreamCallAndBothGetTheValue) {
  std::string value0, value1;
  grpc::Status status0, status1;
  std::thread get0([&] { status0 = Get("secret-0", "addr", absl::Seconds(20), &value0); });
  ASSERT_TRUE(WaitParked(1));
  std::thread get1([&] { status1 = Get("secret-1", "addr", absl::Seconds(10), &value1); });
  // The second get is at the agent before the value comes.
  for (int i = 0; i < 1000 && relay_->pending() < 2; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(relay_->pending(), 2);
  ASSERT_TRUE(Set("secret-0", kNamespace, "addr", "10.0.0.1:5000").ok());
  get0.join();
  get1.join();
  EXPECT_EQ(relay_->pending(), 0);
  EXPECT_TRUE(status0.ok()) << status0.error_message();
  EXPECT_TRUE(status1.ok()) << status1.error_message();
  EXPECT_EQ(value0, "10.0.0.1:5000");
  EXPECT_EQ(value1, "10.0.0.1:5000");
  absl::MutexLock lock(&coordinator_.mu_);
  EXPECT_EQ(coordinator_.gets_, 1);
  // Upstream calls carry the token of a rank of the caller's job attempt.
  for (const std::string& a : coordinator_.authorizations_) {
    EXPECT_TRUE(a == "Bearer secret-0" || a == "Bearer secret-1") << a;
  }
}

TEST_F(StoreRelayTest, AWaiterWhoseDeadlinePassesGetsDeadlineExceededTheOtherTheValue) {
  std::string value_long, value_short;
  grpc::Status status_long, status_short;
  std::thread get_long(
      [&] { status_long = Get("secret-0", "late", absl::Seconds(20), &value_long); });
  ASSERT_TRUE(WaitParked(1));
  status_short = Get("secret-1", "late", absl::Milliseconds(100), &value_short);
  EXPECT_EQ(status_short.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << status_short.error_message();
  ASSERT_TRUE(Set("secret-1", kNamespace, "late", "v").ok());
  get_long.join();
  EXPECT_TRUE(status_long.ok()) << status_long.error_message();
  EXPECT_EQ(value_long, "v");
}

TEST_F(StoreRelayTest, AWaiterLeftWhenTheSharedGetEndsWithoutAValueIsServedByANewOne) {
  // The short waiter starts the upstream get (it waits 300 ms); the long
  // one joins it, and outlives it.
  std::string value_short, value_long;
  grpc::Status status_short, status_long;
  std::thread get_short(
      [&] { status_short = Get("secret-0", "slow", absl::Milliseconds(300), &value_short); });
  ASSERT_TRUE(WaitParked(1));
  std::thread get_long(
      [&] { status_long = Get("secret-1", "slow", absl::Seconds(20), &value_long); });
  get_short.join();
  EXPECT_EQ(status_short.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The upstream get ended at its wait_ms; a new one waits for the long waiter.
  for (int i = 0; i < 1000; ++i) {
    {
      absl::MutexLock lock(&coordinator_.mu_);
      if (coordinator_.gets_ >= 2) break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(WaitParked(1));
  ASSERT_TRUE(Set("secret-0", kNamespace, "slow", "finally").ok());
  get_long.join();
  EXPECT_TRUE(status_long.ok()) << status_long.error_message();
  EXPECT_EQ(value_long, "finally");
  absl::MutexLock lock(&coordinator_.mu_);
  EXPECT_EQ(coordinator_.gets_, 2);
}

TEST_F(StoreRelayTest, ASetIsRetriedThroughUnavailable) {
  {
    absl::MutexLock lock(&coordinator_.mu_);
    coordinator_.fail_batches_ = 2;
  }
  grpc::Status status = Set("secret-0", kNamespace, "k", "v");
  EXPECT_TRUE(status.ok()) << status.error_message();
  absl::MutexLock lock(&coordinator_.mu_);
  EXPECT_EQ(coordinator_.batch_sizes_.size(), 3u);
  EXPECT_EQ(coordinator_.sets_, 1);
  EXPECT_EQ(coordinator_.authorizations_.back(), "Bearer secret-0");
  // The batch is the node's call; only its ops carry rank tokens.
  EXPECT_EQ(coordinator_.batches_with_authorization_, 0);
}

TEST_F(StoreRelayTest, AnAddIsNeverRetried) {
  {
    absl::MutexLock lock(&coordinator_.mu_);
    coordinator_.fail_batches_ = 1;
  }
  int64_t value = 0;
  grpc::Status failed = Add("secret-0", "count", 1, &value);
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::UNAVAILABLE);
  {
    absl::MutexLock lock(&coordinator_.mu_);
    EXPECT_EQ(coordinator_.batch_sizes_.size(), 1u);
    EXPECT_EQ(coordinator_.adds_, 0);
  }
  ASSERT_TRUE(Add("secret-1", "count", 2, &value).ok());
  EXPECT_EQ(value, 2);
}

TEST_F(StoreRelayTest, CallsMadeWhileABatchIsInFlightGoTogetherWithTheirOwnResults) {
  {
    absl::MutexLock lock(&coordinator_.mu_);
    coordinator_.hold_batch_ = true;
  }
  grpc::Status first;
  std::thread first_set([&] { first = Set("secret-0", kNamespace, "first", "1"); });
  for (int i = 0; i < 1000 && !coordinator_.holding(); ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(coordinator_.holding());
  // While it is in flight: sets and adds of two ranks, one refused upstream.
  std::vector<std::thread> calls;
  grpc::Status set_a, set_b, refused, add_a, add_b;
  int64_t value_a = 0, value_b = 0;
  calls.emplace_back([&] { set_a = Set("secret-0", kNamespace, "a", "va"); });
  calls.emplace_back([&] { set_b = Set("secret-1", kNamespace, "b", "vb"); });
  calls.emplace_back([&] { refused = Set("secret-1", kNamespace, "refuse-me", "x"); });
  calls.emplace_back([&] { add_a = Add("secret-0", "count-a", 5, &value_a); });
  calls.emplace_back([&] { add_b = Add("secret-1", "count-b", 7, &value_b); });
  for (int i = 0; i < 1000 && relay_->pending() < 6; ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(relay_->pending(), 6);
  ASSERT_TRUE(coordinator_.ReleaseHeld());
  first_set.join();
  for (std::thread& t : calls) t.join();
  EXPECT_TRUE(first.ok()) << first.error_message();
  EXPECT_TRUE(set_a.ok()) << set_a.error_message();
  EXPECT_TRUE(set_b.ok()) << set_b.error_message();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << refused.error_message();
  EXPECT_TRUE(add_a.ok()) << add_a.error_message();
  EXPECT_TRUE(add_b.ok()) << add_b.error_message();
  EXPECT_EQ(value_a, 5);
  EXPECT_EQ(value_b, 7);
  EXPECT_EQ(relay_->upstream_calls(), 2);
  absl::MutexLock lock(&coordinator_.mu_);
  EXPECT_EQ(coordinator_.batch_sizes_, (std::vector<int>{1, 5}));
  // Each op carried its own rank's token.
  int rank0 = 0, rank1 = 0;
  for (const std::string& a : coordinator_.authorizations_) {
    rank0 += a == "Bearer secret-0";
    rank1 += a == "Bearer secret-1";
  }
  EXPECT_EQ(rank0, 3);
  EXPECT_EQ(rank1, 3);
}

TEST_F(StoreRelayTest, ABatchFailingUnavailableRetriesItsSetsAndFailsItsAdds) {
  {
    absl::MutexLock lock(&coordinator_.mu_);
    coordinator_.hold_batch_ = true;
    coordinator_.fail_batches_ = 1;  // the batch after the held one
  }
  grpc::Status first;
  std::thread first_set([&] { first = Set("secret-0", kNamespace, "first", "1"); });
  for (int i = 0; i < 1000 && !coordinator_.holding(); ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(coordinator_.holding());
  grpc::Status set, add;
  int64_t value = 0;
  std::thread set_call([&] { set = Set("secret-0", kNamespace, "k", "v"); });
  std::thread add_call([&] { add = Add("secret-1", "count", 1, &value); });
  for (int i = 0; i < 1000 && relay_->pending() < 3; ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(relay_->pending(), 3);
  ASSERT_TRUE(coordinator_.ReleaseHeld());
  first_set.join();
  set_call.join();
  add_call.join();
  EXPECT_TRUE(first.ok()) << first.error_message();
  EXPECT_TRUE(set.ok()) << set.error_message();
  EXPECT_EQ(add.error_code(), grpc::StatusCode::UNAVAILABLE) << add.error_message();
  absl::MutexLock lock(&coordinator_.mu_);
  // The held one, the failed one (set and add), the set again alone.
  EXPECT_EQ(coordinator_.batch_sizes_, (std::vector<int>{1, 2, 1}));
  EXPECT_EQ(coordinator_.adds_, 0);
  EXPECT_EQ(coordinator_.sets_, 2);
}

TEST_F(StoreRelayTest, PendingCallsOfOneRankAreBounded) {
  // max_pending_per_rank is 4 here: four waiting gets, the fifth is refused.
  std::vector<std::thread> waiting;
  std::vector<grpc::Status> statuses(4);
  std::vector<std::string> values(4);
  for (int i = 0; i < 4; ++i) {
    waiting.emplace_back([&, i] {
      statuses[i] = Get("secret-0", absl::StrCat("key-", i), absl::Seconds(20), &values[i]);
    });
  }
  ASSERT_TRUE(WaitParked(4));
  std::string value;
  grpc::Status refused = Get("secret-0", "key-4", absl::Seconds(1), &value);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("max_pending_per_rank"), std::string::npos)
      << refused.error_message();
  // Another rank is not held back by this one.
  EXPECT_TRUE(Set("secret-1", kNamespace, "key-0", "a").ok());
  relay_->Shutdown();  // answers the rest
  for (std::thread& t : waiting) t.join();
  EXPECT_TRUE(statuses[0].ok());
  EXPECT_EQ(statuses[1].error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(StoreRelayTest, ACallAdmittedBeforeTheLeaseRanOutIsNeverSentAfterIt) {
  {
    absl::MutexLock lock(&coordinator_.mu_);
    coordinator_.hold_batch_ = true;
  }
  grpc::Status first;
  std::thread first_set([&] { first = Set("secret-0", kNamespace, "first", "1"); });
  for (int i = 0; i < 1000 && !coordinator_.holding(); ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(coordinator_.holding());
  // Queued behind the batch in flight, in lease generation 0.
  grpc::Status queued_set, queued_add;
  int64_t value = 0;
  std::thread set_call([&] { queued_set = Set("secret-0", kNamespace, "queued", "v"); });
  std::thread add_call([&] { queued_add = Add("secret-1", "loom/commit/8", 1, &value); });
  for (int i = 0; i < 1000 && relay_->pending() < 3; ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(relay_->pending(), 3);
  // The lease runs out, and runs again, before their batch would go.
  ExpireThenRenewLease();
  ASSERT_TRUE(coordinator_.ReleaseHeld());
  first_set.join();
  set_call.join();
  add_call.join();
  EXPECT_TRUE(first.ok()) << first.error_message();  // sent before the run-out
  EXPECT_EQ(queued_set.error_code(), grpc::StatusCode::UNAVAILABLE) << queued_set.error_message();
  EXPECT_NE(queued_set.error_message().find("lease ran out"), std::string::npos);
  EXPECT_EQ(queued_add.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(relay_->pending(), 0);
  EXPECT_EQ(relay_->upstream_calls(), 1);
  absl::MutexLock lock(&coordinator_.mu_);
  EXPECT_EQ(coordinator_.sets_, 1);
  EXPECT_EQ(coordinator_.adds_, 0);
}

TEST_F(StoreRelayTest, AGetWaiterAdmittedBeforeTheLeaseRanOutGetsNoNewUpstreamCall) {
  // As above (AWaiterLeft...): the long waiter would be served by a new
  // upstream get when the shared one ends; the lease ran out in between.
  std::string value_short, value_long;
  grpc::Status status_short, status_long;
  std::thread get_short(
      [&] { status_short = Get("secret-0", "slow", absl::Milliseconds(1000), &value_short); });
  ASSERT_TRUE(WaitParked(1));
  std::thread get_long(
      [&] { status_long = Get("secret-1", "slow", absl::Seconds(20), &value_long); });
  for (int i = 0; i < 1000 && relay_->pending() < 2; ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(relay_->pending(), 2);
  ExpireThenRenewLease();
  get_short.join();
  get_long.join();
  EXPECT_EQ(status_short.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(status_long.error_code(), grpc::StatusCode::UNAVAILABLE) << status_long.error_message();
  EXPECT_EQ(relay_->pending(), 0);
  absl::MutexLock lock(&coordinator_.mu_);
  EXPECT_EQ(coordinator_.gets_, 1);
}

}  // namespace
}  // namespace loom::agent
