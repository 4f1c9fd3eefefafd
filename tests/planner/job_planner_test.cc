// The planner as jobs use it (planner/job_planner.h): ResolveLayout at
// submission, PlanJobSpec for `loomctl plan` (the coordinator's PlanJob and
// --offline alike).
#include "planner/job_planner.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/layout.h"
#include "gtest/gtest.h"
#include "planner/memory_model.h"
#include "planner/plan_request.h"

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

// The scheduler's duration estimate: one step of the resolved layout, more
// for more work per step (a larger global batch on the same ranks).
TEST(PredictStepSeconds, PredictsTheResolvedLayoutsStepAndScalesWithTheWork) {
  spec::JobSpec job = CpuAutoJob();
  ASSERT_TRUE(ResolveLayout(job).ok());
  absl::StatusOr<double> step = PredictStepSeconds(job);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_GT(*step, 0);
  EXPECT_LT(*step, 3600);
  spec::JobSpec bigger = job;
  bigger.train.global_batch_size *= 4;
  absl::StatusOr<double> more = PredictStepSeconds(bigger);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_GT(*more, 2 * *step);
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

// Megatron-LM's 1T configuration (Narayanan et al., SC'21, table 1: 128
// layers of 25,600, 160 heads, sequence 2,048, global batch 3,072 on 3,072
// A100s as tp8 pp64 dp6, full recomputation), every axis given.
std::string Megatron1T(const std::string& micro_batch_size) {
  return absl::StrCat(R"(
name: megatron-1t
model: {vocab_size: 51200, hidden_size: 25600, num_layers: 128, num_heads: 160,
        ffn_hidden_size: 102400, max_seq_len: 2048}
train: {global_batch_size: 3072, micro_batch_size: )",
                      micro_batch_size, R"(, seq_len: 2048, precision: bf16, eval_interval: 0}
data: {train_path: train.bin, format: bin}
parallelism: {dp: 6, tp: 8, pp: 64, cp: 1, ep: 1, zero_stage: 0, recompute: full}
resources: {device: gpu, gpu: a100-80gb, nodes: 384, gpus_per_node: 8}
fault_tolerance: {snapshot_interval: 0}
)");
}

// With every axis fixed the planner still chooses the micro-batch size when
// the spec leaves it (`auto`): the 1T configuration fits at mbs 1, not at 2.
TEST(PlanJobSpec, ChoosesTheMicroBatchSizeWithEveryAxisFixed) {
  PlanOptions megatron;
  megatron.profile = "megatron";
  absl::StatusOr<JobPlan> fixed = PlanJobSpec(Megatron1T("2"), "1t.yaml", megatron);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_TRUE(fixed->result.ranked.empty());  // mbs 2: out of memory, the only layout
  ASSERT_EQ(fixed->result.rejected.size(), 1u);

  absl::StatusOr<JobPlan> chosen = PlanJobSpec(Megatron1T("auto"), "1t.yaml", megatron);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_FALSE(chosen->result.ranked.empty());
  const Layout& best = chosen->result.ranked.front().layout;
  EXPECT_EQ(best.micro_batch_size, 1);
  EXPECT_EQ(best.tp, 8);
  EXPECT_EQ(best.pp, 64);
  EXPECT_EQ(best.dp, 6);
  EXPECT_EQ(best.grad_accum, 512);
  EXPECT_GT(chosen->result.layouts_considered, 1);
}

// At submission: `auto` is resolved to a size that fits and written back;
// a given size that does not fit is refused with the size that does.
TEST(ResolveLayout, MicroBatchSizeAutoWithEveryAxisGiven) {
  spec::JobSpec job = CpuAutoJob();
  job.parallelism = {};
  job.parallelism.dp = 4;
  job.parallelism.tp = 1;
  job.parallelism.pp = 1;
  job.parallelism.cp = 1;
  job.parallelism.ep = 1;
  job.parallelism.zero_stage = 0;
  job.train.micro_batch_size = 4;
  // A rank's memory between what mbs 2 and mbs 4 need (the CPU model's own
  // numbers, measured here rather than assumed).
  absl::StatusOr<PlanRequest> request = PlanRequestFromJob(job);
  ASSERT_TRUE(request.ok()) << request.status();
  spec::Layout l = spec::LayoutOf(job);
  const double at4 = EstimateMemory(request->workload, l, request->constants).total();
  l.micro_batch_size = 2;
  l.grad_accum = 2;
  const double at2 = EstimateMemory(request->workload, l, request->constants).total();
  ASSERT_LT(at2, at4);
  job.resources.memory_mb = static_cast<int64_t>((at2 + at4) / 2 / (1 << 20));
  ASSERT_GT(job.resources.memory_mb * double{1 << 20}, at2);

  spec::JobSpec given = job;
  const absl::Status refused = ResolveLayout(given);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("train.micro_batch_size=2 fits with these axes"),
            std::string::npos)
      << refused;

  job.train.micro_batch_size_auto = true;
  job.train.micro_batch_size = 1;
  ASSERT_TRUE(ResolveLayout(job).ok()) << ResolveLayout(job);
  EXPECT_FALSE(job.train.micro_batch_size_auto);
  EXPECT_EQ(job.parallelism.dp, 4);
  EXPECT_LE(job.train.micro_batch_size, 2);
  EXPECT_TRUE(spec::ValidateJobSpec(job).ok()) << spec::ValidateJobSpec(job);
}

spec::JobSpec GpuAutoJob() {
  spec::JobSpec job = CpuAutoJob();
  job.model.num_layers = 8;
  job.train.global_batch_size = 64;
  job.resources.device = spec::DeviceKind::kGpu;
  job.resources.gpu = "h100-sxm";
  job.resources.nodes = 2;
  job.resources.gpus_per_node = 4;
  return job;
}

// A framework profile picks only what that framework runs: nanotron has no
// ZeRO-2 or -3 and no interleaved schedule; a spec that fixes either is
// refused naming the field.
TEST(PlanJobSpec, NanotronProfilePicksOnlyWhatNanotronRuns) {
  PlanOptions nanotron;
  nanotron.profile = "nanotron";
  nanotron.max_candidates = 1000;
  absl::StatusOr<JobPlan> plan = PlanJobSpec(spec::ToYaml(GpuAutoJob()), "gpu.yaml", nanotron);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->result.ranked.empty());
  for (const Candidate& c : plan->result.ranked) {
    EXPECT_LE(c.layout.zero_stage, 1) << LayoutToString(c.layout);
    EXPECT_NE(c.layout.schedule, spec::Schedule::kInterleaved) << LayoutToString(c.layout);
  }
  for (const Rejection& r : plan->result.rejected) EXPECT_LE(r.layout.zero_stage, 1);
  // Loom's engine, on the same spec, does consider ZeRO-3.
  absl::StatusOr<JobPlan> loom = PlanJobSpec(spec::ToYaml(GpuAutoJob()), "gpu.yaml");
  ASSERT_TRUE(loom.ok()) << loom.status();
  bool zero3 = false;
  for (const Candidate& c : loom->result.ranked) zero3 = zero3 || c.layout.zero_stage == 3;
  EXPECT_TRUE(zero3);

  spec::JobSpec fixed = GpuAutoJob();
  fixed.parallelism.auto_all = false;
  fixed.parallelism.zero_stage = 3;
  absl::StatusOr<JobPlan> refused = PlanJobSpec(spec::ToYaml(fixed), "gpu.yaml", nanotron);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(
                "parallelism.zero_stage=3 is not run by --profile=nanotron (ZeRO stages 0-1)"),
            std::string::npos)
      << refused.status();
  fixed.parallelism.zero_stage = 1;
  fixed.parallelism.pp = 2;
  fixed.parallelism.schedule = spec::Schedule::kInterleaved;
  fixed.parallelism.virtual_stages = 2;
  refused = PlanJobSpec(spec::ToYaml(fixed), "gpu.yaml", nanotron);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("parallelism.schedule=interleaved is not run by "
                                            "--profile=nanotron"),
            std::string::npos)
      << refused.status();
}

spec::JobSpec CpuDp4Job() {
  spec::JobSpec job = CpuAutoJob();
  job.parallelism = {};
  job.parallelism.dp = 4;
  job.parallelism.tp = 1;
  job.parallelism.pp = 1;
  job.parallelism.cp = 1;
  job.parallelism.ep = 1;
  job.parallelism.zero_stage = 0;
  return job;
}

// Re-planned onto fewer ranks the job keeps its global batch (more
// accumulation), with a layout the engine runs; onto a size no layout takes
// it says why.
TEST(ReplanOnRanks, KeepsTheGlobalBatchOnFewerRanks) {
  const spec::JobSpec job = CpuDp4Job();
  for (int64_t ranks : {2, 1, 4, 8}) {
    absl::StatusOr<spec::JobSpec> replanned = ReplanOnRanks(job, ranks);
    ASSERT_TRUE(replanned.ok()) << ranks << ": " << replanned.status();
    const spec::Layout l = spec::LayoutOf(*replanned);
    EXPECT_EQ(replanned->resources.ranks, ranks);
    EXPECT_EQ(l.world(), ranks);
    EXPECT_EQ(l.micro_batch_size * l.grad_accum * l.data_replicas(), 16) << LayoutToString(l);
    EXPECT_EQ(replanned->train.global_batch_size, 16);
    EXPECT_EQ(replanned->train.steps, job.train.steps);
    EXPECT_TRUE(spec::ValidateJobSpec(*replanned).ok()) << spec::ValidateJobSpec(*replanned);
    EXPECT_TRUE(spec::ValidateEngineRuns(*replanned, l).ok());
  }
  // 3 ranks: 4 heads and 4 layers do not split in 3, 16 sequences not over dp3.
  absl::StatusOr<spec::JobSpec> three = ReplanOnRanks(job, 3);
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.status().code(), absl::StatusCode::kInvalidArgument) << three.status();
  EXPECT_NE(three.status().message().find("no layout of 3 ranks"), std::string::npos);

  spec::JobSpec small = job;
  small.resources.memory_mb = 1;
  absl::StatusOr<spec::JobSpec> none = ReplanOnRanks(small, 2);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted) << none.status();
  EXPECT_NE(none.status().message().find("keeping train.global_batch_size=16"), std::string::npos);

  spec::JobSpec gpu = GpuAutoJob();
  absl::StatusOr<spec::JobSpec> partial = ReplanOnRanks(gpu, 6);
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.status().message().find("whole nodes of resources.gpus_per_node=4"),
            std::string::npos)
      << partial.status();
  absl::StatusOr<spec::JobSpec> one_node = ReplanOnRanks(gpu, 4);
  ASSERT_TRUE(one_node.ok()) << one_node.status();
  EXPECT_EQ(one_node->resources.nodes, 1);
  EXPECT_EQ(spec::LayoutOf(*one_node).world(), 4);
}

}  // namespace
}  // namespace loom::planner
