// Bounded admission and state in the JobManager: every oversized request is
// refused naming its field, placement and sending happen on the scheduler
// thread, a launch above the transport limit fails the job without blaming
// its node, ListJobs pages without specs, GetJob has the placement only when
// asked, ended jobs can be deleted and are forgotten after their retention,
// and job ids are never reused.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/jobs/assignment_builder.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/sqlite_job_store.h"
#include "coordinator/rendezvous/kv_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/job_manager_harness.h"

namespace loom::coordinator {
namespace {

using ::testing::HasSubstr;
using loom::v1::JobState;

using testing::kSmallDpSpec;
using testing::RecordingChannel;

class JobManagerBounds : public testing::JobManagerHarness {
 protected:
  JobManagerBounds() : JobManagerHarness("loom_job_manager_bounds") {}
};

TEST_F(JobManagerBounds, OversizedSubmissionsAreRefusedNamingTheField) {
  JobManagerOptions options;
  options.max_job_ranks = 64;
  Start(options);
  const std::string huge = std::string(kSmallDpSpec) + "# " + std::string(300 * 1024, 'x') + "\n";
  auto too_big = jobs_->Submit(huge, "job.yaml", "", "alice");
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("at most 262144 bytes"));

  auto layers = jobs_->Submit(absl::StrReplaceAll(kSmallDpSpec, {{"num_layers: 2", "num_layers: 1000000000"}}),
                              "job.yaml", "", "alice");
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(layers.status().message()), HasSubstr("model.num_layers=1000000000"));

  auto ranks = jobs_->Submit(
      absl::StrReplaceAll(kSmallDpSpec, {{"ranks: 2", "ranks: 1000000000"}, {"dp: 2, ", ""}}), "job.yaml",
      "", "alice");
  EXPECT_EQ(ranks.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ranks.status().message()), HasSubstr("resources.ranks=1000000000"));

  auto cluster = jobs_->Submit(
      absl::StrReplaceAll(kSmallDpSpec, {{"ranks: 2", "ranks: 128"}, {"dp: 2, ", ""}}), "job.yaml", "", "alice");
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cluster.status().message()),
              HasSubstr("resources.ranks=128 must be at most 64"));
  EXPECT_TRUE(jobs_->List()->jobs.empty());
}

TEST_F(JobManagerBounds, AGivenLayoutMustFitInMemory) {
  Start();
  auto job = jobs_->Submit(
      absl::StrReplaceAll(kSmallDpSpec, {{"hidden_size: 32", "hidden_size: 65536"},
                                  {"num_layers: 2", "num_layers: 4000"},
                                  {"num_heads: 2", "num_heads: 512"},
                                  {"ffn_hidden_size: 64", "ffn_hidden_size: 262144"}}),
      "job.yaml", "", "alice");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("does not fit in memory"));
}

TEST_F(JobManagerBounds, PlacementRunsOnTheSchedulerWithAnUnguessableNamespace) {
  Start();
  auto node = AddNode("node-a", 4);
  auto first = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  auto second = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(first.ok() && second.ok());
  jobs_->WaitIdle();
  EXPECT_EQ(jobs_->Get(first->id())->state(), JobState::STARTING);
  EXPECT_EQ(jobs_->Get(second->id())->state(), JobState::STARTING);
  std::vector<std::string> namespaces;
  for (const auto& m : node->messages()) {
    ASSERT_TRUE(m.has_launch());
    namespaces.push_back(m.launch().assignment().store_namespace());
  }
  ASSERT_EQ(namespaces.size(), 4u);
  EXPECT_THAT(namespaces[0], ::testing::StartsWith(first->id() + "/attempt-1-"));
  EXPECT_GE(namespaces[0].size(), first->id().size() + 11 + 32);
  EXPECT_NE(namespaces[0], namespaces[2]);
  // Open while the attempt lives, gone when it ends.
  EXPECT_TRUE(kv_.Set(namespaces[0], "k", "v").ok());
  EXPECT_EQ(kv_.Set(StoreNamespace(first->id(), 1), "k", "v").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs_->Get(first->id())->store_namespace().empty());  // never shown
  ASSERT_TRUE(jobs_->Cancel(first->id()).ok());
  EXPECT_EQ(kv_.Set(namespaces[0], "k", "v").code(), absl::StatusCode::kNotFound);
  jobs_->WaitIdle();
  // The cancel's kill went out after the launches, in order.
  const auto messages = node->messages();
  ASSERT_EQ(messages.size(), 5u);
  EXPECT_TRUE(messages.back().has_kill());
}

TEST_F(JobManagerBounds, GetJobHasThePlacementOnlyInTheFullViewAndARestartKeepsIt) {
  Start();
  AddNode("node-a", 2);
  auto job = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(job.ok()) << job.status();
  jobs_->WaitIdle();
  auto basic = jobs_->Get(job->id());
  ASSERT_TRUE(basic.ok());
  EXPECT_EQ(basic->state(), JobState::STARTING);
  EXPECT_EQ(basic->placement_size(), 0);  // a poll stays small however many ranks
  EXPECT_FALSE(basic->resolved_spec_yaml().empty());
  EXPECT_EQ(jobs_->Get(job->id(), loom::v1::JOB_VIEW_BASIC)->placement_size(), 0);
  auto full = jobs_->Get(job->id(), loom::v1::JOB_VIEW_FULL);
  ASSERT_TRUE(full.ok());
  ASSERT_EQ(full->placement_size(), 2);
  EXPECT_EQ(full->placement(1).rank(), 1);
  EXPECT_EQ(full->placement(1).node_id(), "node-a");
  EXPECT_EQ(full->placement(1).peak_flops(), 1e11);
  // Watchers and pages never carry it either.
  EXPECT_EQ(jobs_->List()->jobs.at(0).placement_size(), 0);

  Start();  // a coordinator restart: the stored record had its placement
  auto recovered = jobs_->Get(job->id(), loom::v1::JOB_VIEW_FULL);
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->state(), JobState::STARTING);
  ASSERT_EQ(recovered->placement_size(), 2);
  EXPECT_EQ(recovered->placement(0).node_id(), "node-a");
  EXPECT_EQ(jobs_->Get(job->id())->placement_size(), 0);
}

TEST_F(JobManagerBounds, AJobLargerThanTheWholeClusterDoesNotHoldUpTheQueue) {
  Start();
  AddNode("node-a", 2);
  auto huge = jobs_->Submit(absl::StrReplaceAll(kSmallDpSpec, {{"ranks: 2", "ranks: 8"}, {"dp: 2", "dp: 8"},
                                                        {"global_batch_size: 4", "global_batch_size: 16"}}),
                            "job.yaml", "", "alice");
  ASSERT_TRUE(huge.ok()) << huge.status();
  auto small = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  jobs_->WaitIdle();
  EXPECT_EQ(jobs_->Get(huge->id())->state(), JobState::PENDING);
  EXPECT_EQ(jobs_->Get(small->id())->state(), JobState::STARTING);
  // A job that the cluster could hold once free still waits its turn.
  auto waits = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  auto behind = jobs_->Submit(absl::StrReplaceAll(kSmallDpSpec, {{"ranks: 2", "ranks: 1"}, {"dp: 2", "dp: 1"}}),
                              "job.yaml", "", "alice");
  jobs_->WaitIdle();
  EXPECT_EQ(jobs_->Get(waits->id())->state(), JobState::PENDING);
  EXPECT_EQ(jobs_->Get(behind->id())->state(), JobState::PENDING);
}

TEST_F(JobManagerBounds, ALaunchAboveTheTransportLimitFailsTheJobNotTheNode) {
  JobManagerOptions options;
  options.max_launch_bytes = 200;
  Start(options);
  auto node = AddNode("node-a", 2);
  auto job = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(job.ok());
  jobs_->WaitIdle();
  auto after = jobs_->Get(job->id());
  EXPECT_EQ(after->state(), JobState::FAILED);
  EXPECT_THAT(after->failure_reason(), HasSubstr("above the transport limit of 200 bytes"));
  EXPECT_TRUE(node->messages().empty());
  EXPECT_FALSE(nodes_.Get("node-a")->cordoned);
}

TEST_F(JobManagerBounds, ListJobsPagesWithoutSpecs) {
  Start();
  std::vector<std::string> ids;
  for (int i = 0; i < 25; ++i) ids.push_back(jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice")->id());
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    auto page = jobs_->List(10, token);
    ASSERT_TRUE(page.ok()) << page.status();
    ++pages;
    for (const auto& job : page->jobs) {
      seen.push_back(job.id());
      EXPECT_TRUE(job.spec_yaml().empty());
      EXPECT_TRUE(job.resolved_spec_yaml().empty());
      EXPECT_LE(job.history_size(), 1);
    }
    token = page->next_page_token;
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, ids);
  EXPECT_EQ(jobs_->List(0)->jobs.size(), 25u);
  EXPECT_EQ(jobs_->List(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs_->List(10, "not-a-token").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(jobs_->Get(ids[0])->spec_yaml().empty());  // status shows it
}

TEST_F(JobManagerBounds, EndedJobsCanBeDeletedAndTheirIdsAreNeverReused) {
  Start();
  auto a = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  auto b = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  EXPECT_EQ(jobs_->Delete(b->id()).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(jobs_->Cancel(b->id()).ok());
  ASSERT_TRUE(jobs_->Delete(b->id()).ok());
  EXPECT_EQ(jobs_->Get(b->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs_->Delete(b->id()).code(), absl::StatusCode::kNotFound);
  Start();  // a coordinator restart on the same state
  EXPECT_EQ(jobs_->List()->jobs.size(), 1u);
  auto c = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  EXPECT_NE(c->id(), b->id());
  EXPECT_GT(c->id(), b->id());
}

TEST_F(JobManagerBounds, FinishedJobsAreForgottenAfterTheirRetention) {
  JobManagerOptions options;
  options.finished_job_retention = absl::Minutes(5);
  Start(options);
  auto ended = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  auto waiting = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  ASSERT_TRUE(jobs_->Cancel(ended->id()).ok());
  jobs_->CheckHealth(absl::Now() + absl::Minutes(4));
  EXPECT_TRUE(jobs_->Get(ended->id()).ok());
  Start(options);  // the sweep's clock starts over with the process
  jobs_->CheckHealth(absl::Now() + absl::Minutes(6));
  jobs_->WaitIdle();  // the delete is the persister's
  EXPECT_EQ(jobs_->Get(ended->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs_->Get(waiting->id()).ok());  // not ended: kept
}

TEST_F(JobManagerBounds, ANodeBackFromSilenceIsToldToKillRanksOfAttemptsThatMovedOn) {
  Start();
  auto node = AddNode("node-a", 2);
  auto job = jobs_->Submit(kSmallDpSpec, "job.yaml", "", "alice");
  jobs_->WaitIdle();
  ASSERT_EQ(jobs_->Get(job->id())->state(), JobState::STARTING);
  const size_t launches = node->messages().size();

  // Lost for silence: its ranks are given up and the reason says why.
  ASSERT_EQ(nodes_.ExpireSilent(absl::Now() + absl::Minutes(1), absl::Seconds(3)).size(), 1u);
  jobs_->OnNodeLost("node-a", "no heartbeat for 3s");
  jobs_->WaitIdle();
  auto lost = jobs_->Get(job->id());
  EXPECT_EQ(lost->state(), JobState::RESTARTING);
  EXPECT_THAT(lost->last_diagnosis(), HasSubstr("node node-a was lost (no heartbeat for 3s)"));
  jobs_->WaitIdle();
  EXPECT_EQ(node->messages().size(), launches);  // a lost node is sent nothing

  // Its session speaks again, still running attempt 1's ranks.
  loom::v1::Heartbeat heartbeat;
  for (int rank = 0; rank < 2; ++rank) {
    loom::v1::RunningRank* r = heartbeat.add_running();
    r->set_job_id(job->id());
    r->set_attempt(1);
    r->set_rank(rank);
  }
  ASSERT_EQ(nodes_.Heartbeat("node-a", node.get(), heartbeat, absl::Now()),
            NodeRegistry::HeartbeatResult::kRevived);
  jobs_->OnNodeRevived("node-a", {heartbeat.running().begin(), heartbeat.running().end()});
  jobs_->WaitIdle();
  const auto messages = node->messages();
  ASSERT_GT(messages.size(), launches);
  ASSERT_TRUE(messages[launches].has_kill());
  EXPECT_EQ(messages[launches].kill().job_id(), job->id());
  EXPECT_EQ(messages[launches].kill().attempt(), 1);
}

}  // namespace
}  // namespace loom::coordinator
