// `loomctl trace` at the coordinator (coordinator/service/trace_relay.h):
// which step and ranks a request asks for, one TraceStep per node, the answer
// once every rank's trace is in, a partial one naming the missing ranks at
// the deadline, traces from a node not asked ignored, requests bounded.
#include "coordinator/service/trace_relay.h"

#include <future>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

loom::v1::Job RunningJob() {
  loom::v1::Job job;
  job.set_id("job-1");
  job.set_state(loom::v1::RUNNING);
  job.set_attempt(2);
  job.mutable_last_progress()->set_step(10);
  job.mutable_last_progress()->set_total_steps(100);
  for (int r = 0; r < 4; ++r) {
    loom::v1::RankPlacement* p = job.add_placement();
    p->set_rank(r);
    p->set_node_id(r < 2 ? "node-a" : "node-b");
    p->set_place(absl::StrCat("TP(", r % 2, ")-PP(", r / 2, ")"));
  }
  return job;
}

loom::v1::TraceJobRequest Request(int64_t step = 0, std::vector<int> ranks = {}) {
  loom::v1::TraceJobRequest r;
  r.set_id("job-1");
  r.set_step(step);
  for (int rank : ranks) r.add_ranks(rank);
  return r;
}

TEST(TraceSpecFor, DefaultsToAFewStepsAheadAndEveryRank) {
  absl::StatusOr<TraceSpec> spec = TraceSpecFor(RunningJob(), Request());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->step, 10 + kTraceStepsAhead);
  EXPECT_EQ(spec->attempt, 2);
  ASSERT_EQ(spec->ranks.size(), 4u);
  EXPECT_EQ(spec->ranks[3].node_id, "node-b");
  EXPECT_EQ(spec->ranks[3].place, "TP(1)-PP(1)");
  EXPECT_EQ(spec->wait, absl::Seconds(kDefaultTraceWaitSeconds));
}

TEST(TraceSpecFor, ShortStepsAreAskedForFurtherAhead) {
  loom::v1::Job job = RunningJob();
  job.mutable_last_progress()->set_step_seconds(0.01);  // 100 steps a second
  job.mutable_last_progress()->set_total_steps(1000);
  absl::StatusOr<TraceSpec> spec = TraceSpecFor(job, Request());
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->step, 10 + 100);  // kTraceLeadSeconds ahead, and within train.steps
  job.mutable_last_progress()->set_total_steps(50);
  EXPECT_EQ(TraceSpecFor(job, Request())->step, 50);
  job.mutable_last_progress()->set_step_seconds(2.0);  // slow steps: still a few ahead
  EXPECT_EQ(TraceSpecFor(job, Request())->step, 10 + kTraceStepsAhead);
}

TEST(TraceSpecFor, RefusesABegunStepAnUnknownRankAndAJobNotRunning) {
  EXPECT_THAT(TraceSpecFor(RunningJob(), Request(11)).status().message(),
              HasSubstr("step 11 may have begun already"));
  EXPECT_TRUE(TraceSpecFor(RunningJob(), Request(12)).ok());
  EXPECT_THAT(TraceSpecFor(RunningJob(), Request(101)).status().message(),
              HasSubstr("past the job's last step 100"));
  EXPECT_THAT(TraceSpecFor(RunningJob(), Request(0, {1, 4})).status().message(),
              HasSubstr("ranks: 4 is not a rank of job job-1"));
  absl::StatusOr<TraceSpec> two = TraceSpecFor(RunningJob(), Request(0, {3, 1, 3}));
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->ranks.size(), 2u);
  EXPECT_EQ(two->ranks[0].rank, 1);
  loom::v1::TraceJobRequest long_wait = Request();
  long_wait.set_wait_seconds(kMaxTraceWaitSeconds + 1);
  EXPECT_THAT(TraceSpecFor(RunningJob(), long_wait).status().message(), HasSubstr("wait_seconds"));
  loom::v1::Job queued = RunningJob();
  queued.set_state(loom::v1::PENDING);
  EXPECT_EQ(TraceSpecFor(queued, Request()).status().code(), absl::StatusCode::kFailedPrecondition);
}

// The relay's outgoing messages, by node.
struct Sent {
  std::mutex mu;
  std::map<std::string, std::vector<loom::v1::TraceStep>> by_node;
  TraceRelay::Send Sender() {
    return [this](const std::string& node, const loom::v1::CoordinatorMessage& m) {
      std::lock_guard lock(mu);
      by_node[node].push_back(m.trace());
      return true;
    };
  }
};

loom::v1::RankProgress Traced(int rank, int64_t step, int attempt = 2) {
  loom::v1::RankProgress p;
  p.set_job_id("job-1");
  p.set_attempt(attempt);
  p.set_rank(rank);
  p.set_step(step);
  loom::v1::StepTrace* t = p.mutable_trace();
  t->set_step(step);
  t->set_start_unix_us(1'000'000 + rank);
  t->add_tracks("compute");
  t->add_names("forward");
  loom::v1::TraceEvent* e = t->add_events();
  e->set_duration_us(100 * (rank + 1));
  return p;
}

using Answer = absl::StatusOr<loom::v1::TraceJobResponse>;

TEST(TraceRelay, AsksEachNodeOnceAndAnswersWhenEveryRanksTraceIsIn) {
  Sent sent;
  TraceRelay relay(sent.Sender());
  absl::StatusOr<TraceSpec> spec = TraceSpecFor(RunningJob(), Request(20));
  ASSERT_TRUE(spec.ok());
  std::promise<Answer> answered;
  ASSERT_TRUE(relay.Start(*spec, [&](Answer a) { answered.set_value(std::move(a)); }).ok());
  {
    std::lock_guard lock(sent.mu);
    ASSERT_EQ(sent.by_node.size(), 2u);
    ASSERT_EQ(sent.by_node["node-a"].size(), 1u);
    const loom::v1::TraceStep& a = sent.by_node["node-a"][0];
    EXPECT_EQ(a.job_id(), "job-1");
    EXPECT_EQ(a.attempt(), 2);
    EXPECT_EQ(a.step(), 20);
    EXPECT_THAT(a.ranks(), ElementsAre(0, 1));
  }
  relay.Deliver("node-a", Traced(0, 20));
  relay.Deliver("node-a", Traced(2, 20));  // rank 2 runs on node-b: ignored
  relay.Deliver("node-a", Traced(1, 19));  // another step: ignored
  relay.Deliver("node-a", Traced(1, 20, 1));  // an earlier attempt: ignored
  relay.Deliver("node-a", Traced(1, 20));
  relay.Deliver("node-b", Traced(2, 20));
  std::future<Answer> f = answered.get_future();
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  relay.Deliver("node-b", Traced(3, 20));
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  Answer a = f.get();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->ranks(), ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(a->missing_ranks().empty());
  const nlohmann::json doc = nlohmann::json::parse(a->trace_json());
  int processes = 0;
  for (const auto& e : doc["traceEvents"]) processes += e["name"] == "process_name" ? 1 : 0;
  EXPECT_EQ(processes, 4);
  EXPECT_EQ(relay.pending(), 0u);
}

TEST(TraceRelay, AtTheDeadlineAnswersWithWhatCameAndNamesTheMissingRanks) {
  Sent sent;
  TraceRelay relay(sent.Sender());
  absl::StatusOr<TraceSpec> spec = TraceSpecFor(RunningJob(), Request(20, {0, 3}));
  ASSERT_TRUE(spec.ok());
  spec->wait = absl::Milliseconds(300);
  std::promise<Answer> answered;
  ASSERT_TRUE(relay.Start(*spec, [&](Answer a) { answered.set_value(std::move(a)); }).ok());
  relay.Deliver("node-b", Traced(3, 20));
  std::future<Answer> f = answered.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  Answer a = f.get();
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(a->ranks(), ElementsAre(3));
  EXPECT_THAT(a->missing_ranks(), ElementsAre(0));
  EXPECT_EQ(nlohmann::json::parse(a->trace_json())["otherData"]["missing_ranks"],
            nlohmann::json::array({0}));
}

TEST(TraceRelay, RequestsPerJobAreBoundedAndShutdownAnswersThePendingOnes) {
  Sent sent;
  std::vector<Answer> answers;
  std::mutex mu;
  {
    TraceRelay relay(sent.Sender(), {.max_per_job = 1, .max_requests = 4});
    absl::StatusOr<TraceSpec> spec = TraceSpecFor(RunningJob(), Request(20));
    ASSERT_TRUE(spec.ok());
    auto keep = [&](Answer a) {
      std::lock_guard lock(mu);
      answers.push_back(std::move(a));
    };
    ASSERT_TRUE(relay.Start(*spec, keep).ok());
    EXPECT_EQ(relay.Start(*spec, keep).code(), absl::StatusCode::kResourceExhausted);
  }
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace loom::coordinator
