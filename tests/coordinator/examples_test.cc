// Every job spec shipped in examples/ parses, passes the spec's rules and is
// one the engine runs (what SubmitJob checks before storing a job), so the
// files users copy from stay valid as the rules move; and the composed layouts
// are admitted.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/layout.h"
#include "coordinator/service/plan_service.h"
#include "planner/job_planner.h"
#include "planner/plan_request.h"
#include "planner/search.h"

namespace loom::coordinator {
namespace {

using planner::ResolveLayout;

// What submission checks last: the engine runs the spec's own layout.
absl::Status CheckEngineSupports(const spec::JobSpec& job) {
  return spec::ValidateEngineRuns(job, spec::LayoutOf(job));
}

TEST(ExamplesTest, EveryExampleSpecIsAcceptedAsSubmitted) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(LOOM_EXAMPLES_DIR)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<spec::JobSpec> parsed =
        spec::ParseJobSpecYaml(text.str(), entry.path().filename().string());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(spec::ValidateJobSpec(*parsed).ok()) << spec::ValidateJobSpec(*parsed);
    EXPECT_TRUE(CheckEngineSupports(*parsed).ok()) << CheckEngineSupports(*parsed);
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

// The axes compose: ZeRO (3 included) under TP and PP and tied embeddings
// under PP are admitted; what the mesh cannot cut is refused with the field
// named.
TEST(ExamplesTest, ComposedLayoutsAreAdmitted) {
  spec::JobSpec job;
  job.train.global_batch_size = 16;
  job.train.micro_batch_size = 2;
  job.parallelism.dp = 2;
  job.parallelism.tp = 2;
  job.parallelism.pp = 2;
  job.model.tie_embeddings = true;
  for (int zero : {0, 1, 2, 3}) {  // ZeRO-3 under PP x DP x TP too
    job.parallelism.zero_stage = zero;
    EXPECT_TRUE(CheckEngineSupports(job).ok()) << zero << ": " << CheckEngineSupports(job);
  }
  job.parallelism.tp = 3;  // what the mesh cannot express: 4 heads over 3 ranks
  const absl::Status refused = CheckEngineSupports(job);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("model.num_heads=4 must be divisible by parallelism.tp=3"),
            std::string::npos) << refused;
}

// A model whose activations dominate: one CPU rank's worth of them under data
// parallelism is what decides whether a layout fits.
spec::JobSpec ActivationHeavyAutoJob() {
  spec::JobSpec job;
  job.name = "auto";
  job.data.train_path = "train.bin";
  job.model.vocab_size = 256;
  job.model.hidden_size = 128;
  job.model.num_layers = 4;
  job.model.num_heads = 4;
  job.model.num_kv_heads = 4;
  job.model.ffn_hidden_size = 384;
  job.model.max_seq_len = 1024;
  job.train.seq_len = 1024;
  job.train.global_batch_size = 2;
  job.train.micro_batch_size = 1;
  job.train.eval_interval = 0;
  job.resources.ranks = 2;
  job.parallelism.auto_all = true;
  return job;
}

// `parallelism: auto` searches tp and pp (not only dp): with a rank memory
// limit that no data-parallel layout fits under (whatever its ZeRO stage) but
// a tensor- or pipeline-parallel one does, the pick has tp or pp > 1, passes
// the spec's rules and is one the engine runs.
TEST(AutoLayoutTest, PicksTensorOrPipelineWhenNoDataParallelLayoutFits) {
  spec::JobSpec job = ActivationHeavyAutoJob();
  ASSERT_TRUE(spec::ValidateJobSpec(job).ok()) << spec::ValidateJobSpec(job);
  absl::StatusOr<planner::PlanRequest> request = planner::PlanRequestFromJob(job);
  ASSERT_TRUE(request.ok()) << request.status();
  request->space.cp = 1;
  request->space.ep = 1;
  request->cluster.memory_bytes = 1e15;
  absl::StatusOr<planner::PlanResult> all = planner::PlanLayouts(*request);
  ASSERT_TRUE(all.ok()) << all.status();
  double min_dp_only = 1e300, min_split = 1e300;
  for (const planner::Candidate& c : all->ranked) {
    spec::JobSpec resolved = job;
    spec::ApplyLayout(c.layout, &resolved);
    if (!spec::CheckJobSpec(resolved).empty()) continue;
    if (!spec::CheckEngineRuns(resolved, c.layout).empty()) continue;
    double& min = (c.layout.tp > 1 || c.layout.pp > 1) ? min_split : min_dp_only;
    min = std::min(min, c.memory.total());
  }
  constexpr double kMiB = 1 << 20;
  ASSERT_LT(min_split + kMiB, min_dp_only) << "the model no longer needs tp or pp to save memory";
  // The limit the integration test (test_parallel_jobs.py) sets: between the two.
  job.resources.memory_mb = static_cast<int64_t>(min_split / kMiB) + 1;
  ASSERT_LT(static_cast<double>(job.resources.memory_mb) * kMiB, min_dp_only);
  std::cout << "memory: tp/pp " << min_split / kMiB << " MiB, dp only " << min_dp_only / kMiB
            << " MiB, limit " << job.resources.memory_mb << " MiB\n";

  ASSERT_TRUE(ResolveLayout(job).ok()) << ResolveLayout(job);
  const spec::Layout picked = spec::LayoutOf(job);
  EXPECT_TRUE(picked.tp > 1 || picked.pp > 1) << "dp=" << picked.dp;
  EXPECT_TRUE(spec::ValidateJobSpec(job).ok()) << spec::ValidateJobSpec(job);
  EXPECT_TRUE(CheckEngineSupports(job).ok()) << CheckEngineSupports(job);
}

// What the engine refuses is never searched: cp and ep stay 1 and ZeRO-3
// never meets a pipeline with DP.
TEST(AutoLayoutTest, SearchesOnlyLayoutsTheEngineRuns) {
  spec::JobSpec job = ActivationHeavyAutoJob();
  job.resources.ranks = 8;
  job.train.global_batch_size = 8;
  job.train.seq_len = 256;
  ASSERT_TRUE(ResolveLayout(job).ok()) << ResolveLayout(job);
  const spec::Layout picked = spec::LayoutOf(job);
  EXPECT_EQ(picked.cp, 1);
  EXPECT_EQ(picked.ep, 1);
  EXPECT_EQ(picked.world(), 8);
  EXPECT_TRUE(CheckEngineSupports(job).ok()) << CheckEngineSupports(job);
}

// `loomctl plan --profile=...`: the framework profiles the planner has, for
// GPU jobs; a CPU job has only Loom's engine; an unknown name lists the known.
TEST(PlanProfileTest, PlansWithEachFrameworkProfile) {
  spec::JobSpec job = ActivationHeavyAutoJob();
  job.resources.device = spec::DeviceKind::kGpu;
  job.resources.gpu = "h100-sxm";
  job.resources.nodes = 1;
  job.resources.gpus_per_node = 8;
  job.train.global_batch_size = 64;
  loom::v1::PlanJobRequest request;
  request.set_spec_yaml(spec::ToYaml(job));
  std::string best[3];
  int i = 0;
  for (const char* profile : {"loom", "nanotron", "megatron"}) {
    request.set_profile(profile);
    absl::StatusOr<loom::v1::PlanJobResponse> plan = PlanJob(request);
    ASSERT_TRUE(plan.ok()) << profile << ": " << plan.status();
    ASSERT_GT(plan->candidates_size(), 0) << profile;
    EXPECT_EQ(plan->text().find("Framework profile: megatron") != std::string::npos,
              std::string(profile) == "megatron");
    best[i++] = absl::StrCat(plan->candidates(0).step_seconds());
  }
  EXPECT_NE(best[0], best[2]) << "the profiles predict the same step time";
  request.set_profile("deepspeed");
  absl::StatusOr<loom::v1::PlanJobResponse> unknown = PlanJob(request);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("loom, nanotron or megatron"), std::string::npos);
  request.set_spec_yaml(spec::ToYaml(ActivationHeavyAutoJob()));
  request.set_profile("megatron");
  absl::StatusOr<loom::v1::PlanJobResponse> cpu = PlanJob(request);
  ASSERT_FALSE(cpu.ok());
  EXPECT_NE(cpu.status().message().find("resources.device=cpu"), std::string::npos);
}

}  // namespace
}  // namespace loom::coordinator
