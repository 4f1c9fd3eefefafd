// Elastic jobs' sizing (coordinator/jobs/elastic_policy.h): to how many ranks
// a job that lost devices shrinks, when it waits and why, and when it grows
// back; the sizes come from the real planner.
#include "coordinator/jobs/elastic_policy.h"

#include <string>

#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/layout.h"
#include "gtest/gtest.h"
#include "planner/job_planner.h"

namespace loom::coordinator {
namespace {

// The job: dp4 on CPU ranks, global batch 16, may shrink to 2.
spec::JobSpec Dp4(int64_t min_ranks) {
  spec::JobSpec job;
  job.name = "elastic";
  job.data.train_path = "train.bin";
  job.model.vocab_size = 256;
  job.model.hidden_size = 128;
  job.model.num_layers = 4;
  job.model.num_heads = 4;
  job.model.num_kv_heads = 4;
  job.model.ffn_hidden_size = 384;
  job.model.max_seq_len = 256;
  job.train.seq_len = 128;
  job.train.global_batch_size = 16;
  job.train.micro_batch_size = 2;
  job.train.eval_interval = 0;
  job.resources.ranks = 4;
  job.parallelism.dp = 4;
  job.parallelism.tp = 1;
  job.parallelism.pp = 1;
  job.parallelism.cp = 1;
  job.parallelism.ep = 1;
  job.parallelism.zero_stage = 0;
  job.fault_tolerance.min_ranks = min_ranks;
  job.fault_tolerance.min_resize_interval_s = 60;
  return job;
}

TEST(DecideShrink, ShrinksToTheDevicesLeftKeepingTheGlobalBatch) {
  const spec::JobSpec job = Dp4(2);
  const ElasticDecision d = DecideShrink(job, job, 2, "node n2 lost");
  ASSERT_EQ(d.action, ElasticAction::kResize) << d.reason;
  EXPECT_EQ(d.ranks, 2);
  EXPECT_EQ(d.spec.resources.ranks, 2);
  const spec::Layout l = spec::LayoutOf(d.spec);
  EXPECT_EQ(l.world(), 2);
  EXPECT_EQ(l.micro_batch_size * l.grad_accum * l.data_replicas(), 16);
  EXPECT_TRUE(spec::ValidateJobSpec(d.spec).ok()) << spec::ValidateJobSpec(d.spec);
  EXPECT_EQ(d.reason.rfind("shrinks from dp=4 ", 0), 0u) << d.reason;
  EXPECT_NE(d.reason.find("(4 ranks) to "), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("(2 ranks): node n2 lost"), std::string::npos) << d.reason;
}

// 3 devices left: no layout of 3 ranks runs this model (4 heads, 4 layers,
// 16 sequences), so the largest size that does, 2, is taken.
TEST(DecideShrink, TakesTheLargestSizeTheJobRunsAt) {
  const spec::JobSpec job = Dp4(1);
  const ElasticDecision d = DecideShrink(job, job, 3, "rank 3 lost");
  ASSERT_EQ(d.action, ElasticAction::kResize) << d.reason;
  EXPECT_EQ(d.ranks, 2);
}

TEST(DecideShrink, WaitsBelowMinRanksSayingWhy) {
  const spec::JobSpec job = Dp4(2);
  ElasticDecision d = DecideShrink(job, job, 1, "node n2 lost");
  EXPECT_EQ(d.action, ElasticAction::kWait);
  EXPECT_EQ(d.reason,
            "node n2 lost; waits: 1 ranks' devices available, below fault_tolerance.min_ranks=2");

  d = DecideShrink(Dp4(0), Dp4(0), 2, "node n2 lost");  // min_ranks unset: never shrinks
  EXPECT_EQ(d.action, ElasticAction::kWait);
  EXPECT_NE(d.reason.find("fault_tolerance.min_ranks is not set"), std::string::npos) << d.reason;

  spec::JobSpec three = Dp4(3);  // 3 is allowed, but no layout of 3 ranks runs
  d = DecideShrink(three, three, 3, "rank 3 lost");
  EXPECT_EQ(d.action, ElasticAction::kWait);
  EXPECT_NE(d.reason.find("no layout of 3 to 3 ranks runs the job"), std::string::npos) << d.reason;

  d = DecideShrink(job, job, 4, "rank 3 lost");  // room for all: nothing to shrink
  EXPECT_EQ(d.action, ElasticAction::kKeep);
}

TEST(DecideGrow, GrowsBackToTheRequestedLayoutAfterTheMinimumInterval) {
  const spec::JobSpec job = Dp4(2);
  const spec::JobSpec shrunk = DecideShrink(job, job, 2, "node n2 lost").spec;
  const absl::Time resized = absl::FromUnixSeconds(1000);

  ElasticDecision d = DecideGrow(job, shrunk, 4, resized + absl::Seconds(30), resized);
  EXPECT_EQ(d.action, ElasticAction::kKeep);  // too soon: 30 s of 60
  EXPECT_NE(d.reason.find("min_resize_interval_s=60"), std::string::npos) << d.reason;

  d = DecideGrow(job, shrunk, 2, resized + absl::Seconds(90), resized);
  EXPECT_EQ(d.action, ElasticAction::kKeep);  // no more devices
  EXPECT_NE(d.reason.find("no more devices"), std::string::npos) << d.reason;

  d = DecideGrow(job, shrunk, 4, resized + absl::Seconds(90), resized);
  ASSERT_EQ(d.action, ElasticAction::kResize) << d.reason;
  EXPECT_EQ(d.ranks, 4);
  EXPECT_EQ(spec::LayoutOf(d.spec), spec::LayoutOf(job));  // the layout it asked for
  EXPECT_EQ(d.reason.rfind("grows back from ", 0), 0u) << d.reason;

  d = DecideGrow(job, job, 8, resized + absl::Seconds(90), resized);
  EXPECT_EQ(d.action, ElasticAction::kKeep);  // never above the requested size
  EXPECT_EQ(d.reason, "runs at its requested size");
}

// On GPUs sizes go by whole nodes.
TEST(DecideShrink, GpuJobsShrinkByWholeNodes) {
  spec::JobSpec job = Dp4(4);
  job.resources.device = spec::DeviceKind::kGpu;
  job.resources.gpu = "h100-sxm";
  job.resources.nodes = 2;
  job.resources.gpus_per_node = 4;
  job.parallelism.dp = 8;
  const ElasticDecision d = DecideShrink(job, job, 7, "node n2 lost");
  ASSERT_EQ(d.action, ElasticAction::kResize) << d.reason;
  EXPECT_EQ(d.ranks, 4);
  EXPECT_EQ(d.spec.resources.nodes, 1);
}

// The requested size comes back from the spec as submitted (its layout
// resolved as at admission) over the shrunk spec the job runs under.
TEST(RequestedSpec, TheSubmittedSizeOverTheCurrentSpec) {
  const spec::JobSpec job = Dp4(2);
  const spec::JobSpec shrunk = DecideShrink(job, job, 2, "node n2 lost").spec;
  absl::StatusOr<spec::JobSpec> requested = RequestedSpec(spec::ToYaml(job), shrunk);
  ASSERT_TRUE(requested.ok()) << requested.status();
  EXPECT_EQ(requested->resources.ranks, 4);
  EXPECT_EQ(spec::LayoutOf(*requested), spec::LayoutOf(job));
  absl::StatusOr<spec::JobSpec> same = RequestedSpec(spec::ToYaml(job), job);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(spec::ToYaml(*same), spec::ToYaml(job));
  EXPECT_FALSE(RequestedSpec("name: [", shrunk).ok());
}

// The newest resize (or stop to grow back) in the history, never any other event.
TEST(LastResize, TheNewestResizeEvent) {
  loom::v1::Job job;
  EXPECT_EQ(LastResize(job), absl::InfinitePast());
  auto add = [&job](int64_t ms, const std::string& message) {
    loom::v1::JobEvent* e = job.add_history();
    e->set_time_unix_ms(ms);
    e->set_message(message);
  };
  add(1000, "attempt 1 placed on node-a (ranks 0-1)");
  EXPECT_EQ(LastResize(job), absl::InfinitePast());
  add(2000, "shrinks from dp=4 (4 ranks) to dp=2 (2 ranks): node lost");
  add(3000, "attempt 2 placed on node-a (ranks 0-1)");
  EXPECT_EQ(LastResize(job), absl::FromUnixMillis(2000));
  add(4000, std::string(kStopsToGrowBack) + "4 ranks");
  EXPECT_EQ(LastResize(job), absl::FromUnixMillis(4000));
  add(5000, "grows back from dp=2 (2 ranks) to dp=4 (4 ranks): 2 more");
  EXPECT_EQ(LastResize(job), absl::FromUnixMillis(5000));
}

}  // namespace
}  // namespace loom::coordinator
