// The planner as jobs use it (planner/job_planner.h): ResolveLayout at
// submission, PlanJobSpec for `loomctl plan` (the coordinator's PlanJob and
// --offline alike).
#include "planner/job_planner.h"

#include <string>

#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/layout.h"
#include "gtest/gtest.h"

namespace loom::planner {
namespace {

spec::JobSpec CpuAutoJob() {
  spec::JobSpec job;
  job.name = "plan-me";
  job.data.train_path = "train.bin";
  job.model.vocab_size = 256;
  job.model.hidden_size = 128;
  job.model.num_layers = 4;
  job.model.num_heads = 4;
  job.model.num_kv_heads = 4;
  job.model.ffn_hidden_size = 384;
  job.model.max_seq_len = 256;
  job.train.seq_len = 256;
  job.train.global_batch_size = 16;
  job.train.micro_batch_size = 2;
  job.train.eval_interval = 0;
  job.resources.ranks = 4;
  job.parallelism.auto_all = true;
  return job;
}

// `auto` comes back as a layout the spec's rules and the engine accept, with
// the fastest candidate the search ranks first among those.
TEST(ResolveLayout, FillsAutoWithALayoutTheEngineRuns) {
  spec::JobSpec job = CpuAutoJob();
  ASSERT_TRUE(ResolveLayout(job).ok()) << ResolveLayout(job);
  EXPECT_FALSE(job.parallelism.auto_all);
  const spec::Layout l = spec::LayoutOf(job);
  EXPECT_EQ(l.world(), 4);
  EXPECT_TRUE(spec::ValidateJobSpec(job).ok()) << spec::ValidateJobSpec(job);
  EXPECT_TRUE(spec::ValidateEngineRuns(job, l).ok()) << spec::ValidateEngineRuns(job, l);
}

// A layout given in full is not searched: it stays, and must fit and run.
TEST(ResolveLayout, KeepsAGivenLayoutAndChecksIt) {
  spec::JobSpec job = CpuAutoJob();
  job.parallelism = {};
  job.parallelism.dp = 2;
  job.parallelism.tp = 2;
  job.parallelism.pp = 1;
  job.parallelism.cp = 1;
  job.parallelism.ep = 1;
  job.parallelism.zero_stage = 1;
  spec::JobSpec resolved = job;
  ASSERT_TRUE(ResolveLayout(resolved).ok()) << ResolveLayout(resolved);
  EXPECT_EQ(spec::LayoutOf(resolved), spec::LayoutOf(job));
  job.resources.memory_mb = 1;  // nothing fits a MiB
  const absl::Status refused = ResolveLayout(job);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("the layout given in parallelism does not fit in memory"),
            std::string::npos)
      << refused;
}

// The plan names the spec's source in its errors, shows as many candidates
// as asked, and says which framework profile it models.
TEST(PlanJobSpec, TextJsonCandidatesAndErrors) {
  const std::string yaml = spec::ToYaml(CpuAutoJob());
  PlanOptions options;
  options.max_candidates = 2;
  absl::StatusOr<JobPlan> plan = PlanJobSpec(yaml, "job.yaml", options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->shown, 2);
  EXPECT_EQ(plan->json["runners_up"].size(), 1u);
  EXPECT_NE(plan->text.find("Best:"), std::string::npos);
  EXPECT_EQ(plan->text.find("Framework profile"), std::string::npos);

  spec::JobSpec broken = CpuAutoJob();
  broken.train.seq_len = 1024;  // above max_seq_len
  absl::StatusOr<JobPlan> refused = PlanJobSpec(spec::ToYaml(broken), "broken.yaml");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message().rfind("broken.yaml: ", 0), 0u) << refused.status();
  EXPECT_NE(refused.status().message().find("train.seq_len=1024"), std::string::npos);

  options.profile = "megatron";  // a GPU framework: not for a CPU job
  refused = PlanJobSpec(yaml, "job.yaml", options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("resources.device=cpu"), std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace loom::planner
