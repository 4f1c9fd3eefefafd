// The job spec: strict parsing (unknown fields, types, enums) and every rule
// with its message naming the field path, the value and the rule.
#include <string>

#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/precision_recipe.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::spec {
namespace {

using ::testing::HasSubstr;

constexpr char kValid[] = R"(
name: tiny-llama
model: {vocab_size: 256, hidden_size: 128, num_layers: 4, num_heads: 4, num_kv_heads: 2,
        ffn_hidden_size: 384, max_seq_len: 256, rope_theta: 10000, tie_embeddings: false}
train: {steps: 50, global_batch_size: 16, micro_batch_size: 2, seq_len: 128,
        lr: 3.0e-3, warmup_steps: 5, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0,
        seed: 1234, precision: fp32, eval_interval: 25, eval_windows: 8}
data: {train_path: corpus.txt, val_path: val.txt, format: text}
parallelism: {dp: 2, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 0, schedule: 1f1b,
              virtual_stages: 1, sequence_parallel: false, recompute: none}
resources: {device: cpu, ranks: 2}
checkpoint: {dir: ckpt, interval: 25, keep: 2}
fault_tolerance: {max_restarts: 3, hang_timeout_s: 0}
)";

JobSpec Parse(const std::string& yaml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec{};
}

std::string Errors(const JobSpec& spec) {
  absl::Status status = ValidateJobSpec(spec);
  return status.ok() ? "" : std::string(status.message());
}

TEST(JobSpecYaml, ParsesTheDesignExample) {
  JobSpec s = Parse(kValid);
  EXPECT_EQ(s.name, "tiny-llama");
  EXPECT_EQ(s.model.num_kv_heads, 2);
  EXPECT_EQ(s.train.global_batch_size, 16);
  EXPECT_DOUBLE_EQ(s.train.lr, 3.0e-3);
  EXPECT_EQ(s.parallelism.dp, 2);
  EXPECT_EQ(s.parallelism.schedule, Schedule::k1F1B);
  EXPECT_EQ(s.resources.ranks, 2);
  EXPECT_EQ(s.checkpoint.keep, 2);
  EXPECT_EQ(Errors(s), "");
}

TEST(JobSpecYaml, RoundTripsThroughCanonicalYaml) {
  JobSpec s = Parse(kValid);
  JobSpec again = Parse(ToYaml(s));
  EXPECT_EQ(ToYaml(again), ToYaml(s));
  EXPECT_EQ(again.parallelism.dp, s.parallelism.dp);
  EXPECT_DOUBLE_EQ(again.train.lr, s.train.lr);
}

TEST(JobSpecYaml, SchedulingDefaultsAndRoundTrips) {
  EXPECT_EQ(Parse(kValid).scheduling.priority, 0);
  EXPECT_EQ(Parse(kValid).scheduling.max_runtime_s, 0);
  JobSpec s = Parse(std::string(kValid) + "scheduling: {priority: -3, max_runtime_s: 5400}\n");
  EXPECT_EQ(s.scheduling.priority, -3);
  EXPECT_DOUBLE_EQ(s.scheduling.max_runtime_s, 5400);
  JobSpec again = Parse(ToYaml(s));
  EXPECT_EQ(again.scheduling.priority, -3);
  EXPECT_DOUBLE_EQ(again.scheduling.max_runtime_s, 5400);
  absl::StatusOr<JobSpec> bad =
      ParseJobSpecYaml(std::string(kValid) + "scheduling: {priority: high}\n", "job.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("scheduling.priority"));
}

TEST(JobSpecYaml, ResumeFromRoundTrips) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("keep: 2}"), 8, "keep: 2, resume_from: job-ab12cd-000003}");
  JobSpec s = Parse(yaml);
  EXPECT_EQ(s.checkpoint.resume_from, "job-ab12cd-000003");
  EXPECT_EQ(Parse(ToYaml(s)).checkpoint.resume_from, "job-ab12cd-000003");
  EXPECT_EQ(ToYaml(Parse(kValid)).find("resume_from"), std::string::npos);  // absent: not written
}

TEST(JobSpecYaml, BadStepKnobsRoundTrip) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("hang_timeout_s: 0}"), 18,
               "hang_timeout_s: 0, loss_spike_factor: 4, loss_spike_window: 8, max_bad_steps: 2}");
  JobSpec s = Parse(yaml);
  EXPECT_DOUBLE_EQ(s.fault_tolerance.loss_spike_factor, 4);
  EXPECT_EQ(s.fault_tolerance.loss_spike_window, 8);
  EXPECT_EQ(s.fault_tolerance.max_bad_steps, 2);
  JobSpec again = Parse(ToYaml(s));
  EXPECT_DOUBLE_EQ(again.fault_tolerance.loss_spike_factor, 4);
  EXPECT_EQ(again.fault_tolerance.loss_spike_window, 8);
  EXPECT_EQ(again.fault_tolerance.max_bad_steps, 2);
  EXPECT_DOUBLE_EQ(Parse(kValid).fault_tolerance.loss_spike_factor, 0);  // off by default
}

TEST(JobSpecYaml, StragglerPolicyParsesRoundTripsAndNamesItsChoices) {
  EXPECT_EQ(Parse(kValid).fault_tolerance.straggler, StragglerAction::kReport);  // the default
  std::string yaml = kValid;
  yaml.replace(yaml.find("hang_timeout_s: 0}"), 18, "hang_timeout_s: 0, straggler: replace}");
  JobSpec s = Parse(yaml);
  EXPECT_EQ(s.fault_tolerance.straggler, StragglerAction::kReplace);
  EXPECT_EQ(Parse(ToYaml(s)).fault_tolerance.straggler, StragglerAction::kReplace);
  yaml = kValid;
  yaml.replace(yaml.find("hang_timeout_s: 0}"), 18, "hang_timeout_s: 0, straggler: kill}");
  absl::StatusOr<JobSpec> bad = ParseJobSpecYaml(yaml, "job.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("fault_tolerance.straggler=kill must be one of report | replace"));
}

TEST(JobSpecYaml, CpuRankMemoryRoundTrips) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("ranks: 2}"), 9, "ranks: 2, memory_mb: 88}");
  JobSpec s = Parse(yaml);
  EXPECT_EQ(s.resources.memory_mb, 88);
  EXPECT_EQ(Parse(ToYaml(s)).resources.memory_mb, 88);
  EXPECT_EQ(ToYaml(Parse(kValid)).find("memory_mb"), std::string::npos);  // 0: not written
  s.resources.memory_mb = -1;
  EXPECT_THAT(Errors(s), HasSubstr("resources.memory_mb=-1 must not be negative"));
}

// resources.host_memory_mb: a GPU node's host memory for the planner's
// snapshot check, written back only when set.
TEST(JobSpecYaml, GpuNodeHostMemoryRoundTrips) {
  JobSpec s = Parse(kValid);
  s.resources.device = DeviceKind::kGpu;
  s.resources.gpu = "h100-sxm";
  s.resources.nodes = 1;
  s.resources.gpus_per_node = 2;
  s.resources.host_memory_mb = 2 << 20;
  EXPECT_EQ(Parse(ToYaml(s)).resources.host_memory_mb, 2 << 20);
  s.resources.host_memory_mb = 0;
  EXPECT_EQ(ToYaml(s).find("host_memory_mb"), std::string::npos);  // 0: not written
  s.resources.host_memory_mb = -1;
  EXPECT_THAT(Errors(s), HasSubstr("resources.host_memory_mb=-1 must not be negative"));
}

// train.micro_batch_size: auto leaves it to the planner (1 until resolved),
// written back as auto; ApplyLayout's choice clears it.
TEST(JobSpecYaml, MicroBatchSizeAutoRoundTrips) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("micro_batch_size: 2"), 19, "micro_batch_size: auto");
  JobSpec s = Parse(yaml);
  EXPECT_TRUE(s.train.micro_batch_size_auto);
  EXPECT_EQ(s.train.micro_batch_size, 1);
  EXPECT_EQ(Errors(s), "");
  EXPECT_NE(ToYaml(s).find("micro_batch_size: auto"), std::string::npos);
  EXPECT_TRUE(Parse(ToYaml(s)).train.micro_batch_size_auto);
  EXPECT_FALSE(Parse(kValid).train.micro_batch_size_auto);
  yaml = kValid;
  yaml.replace(yaml.find("micro_batch_size: 2"), 19, "micro_batch_size: two");
  absl::StatusOr<JobSpec> bad = ParseJobSpecYaml(yaml, "job.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("train.micro_batch_size=two must be an integer or auto"));
}

// Elastic jobs: resources.spares, fault_tolerance.min_ranks and
// min_resize_interval_s parse, round-trip and keep their rules (whole nodes
// on GPUs).
TEST(JobSpecYaml, ElasticFieldsRoundTripAndTheirRules) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("ranks: 2}"), 9, "ranks: 2, spares: 1}");
  yaml.replace(yaml.find("hang_timeout_s: 0}"), 18,
               "hang_timeout_s: 0, min_ranks: 1, min_resize_interval_s: 30}");
  JobSpec s = Parse(yaml);
  EXPECT_EQ(s.resources.spares, 1);
  EXPECT_EQ(s.fault_tolerance.min_ranks, 1);
  EXPECT_DOUBLE_EQ(s.fault_tolerance.min_resize_interval_s, 30);
  EXPECT_EQ(Errors(s), "");
  JobSpec again = Parse(ToYaml(s));
  EXPECT_EQ(again.resources.spares, 1);
  EXPECT_EQ(again.fault_tolerance.min_ranks, 1);
  EXPECT_DOUBLE_EQ(again.fault_tolerance.min_resize_interval_s, 30);
  EXPECT_EQ(Parse(kValid).fault_tolerance.min_ranks, 0);  // never shrinks unless asked
  EXPECT_DOUBLE_EQ(Parse(kValid).fault_tolerance.min_resize_interval_s, 300);

  JobSpec bad = s;
  bad.resources.spares = -1;
  bad.fault_tolerance.min_ranks = 3;
  bad.fault_tolerance.min_resize_interval_s = -1;
  EXPECT_THAT(Errors(bad), HasSubstr("resources.spares=-1 must not be negative"));
  EXPECT_THAT(Errors(bad), HasSubstr("fault_tolerance.min_ranks=3 must be between 0 (never "
                                     "shrink) and the job's 2 ranks"));
  EXPECT_THAT(Errors(bad), HasSubstr("fault_tolerance.min_resize_interval_s=-1 must not be "
                                     "negative"));

  JobSpec gpu = s;
  gpu.resources.device = DeviceKind::kGpu;
  gpu.resources.gpu = "h100-sxm";
  gpu.resources.nodes = 2;
  gpu.resources.gpus_per_node = 2;
  gpu.parallelism.dp = 4;
  gpu.fault_tolerance.min_ranks = 3;
  gpu.resources.spares = 1;
  EXPECT_THAT(Errors(gpu), HasSubstr("fault_tolerance.min_ranks=3 must be whole nodes: a "
                                     "multiple of resources.gpus_per_node=2"));
  EXPECT_THAT(Errors(gpu), HasSubstr("resources.spares=1 must be whole nodes"));
  gpu.fault_tolerance.min_ranks = 2;
  gpu.resources.spares = 2;
  EXPECT_EQ(Errors(gpu), "");
}

// model.moe: every field parsed, written back only for an MoE model.
TEST(JobSpecYaml, MoeRoundTrips) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("tie_embeddings: false}"), 22,
               "tie_embeddings: false,\n        moe: {num_experts: 8, top_k: 2, "
               "expert_ffn_hidden_size: 64, num_shared_experts: 1, first_dense_layers: 1, "
               "router_score: sigmoid, aux_loss_coef: 0, bias_update_rate: 0.001, "
               "capacity_factor: 1.25}}");
  JobSpec s = Parse(yaml);
  const MoeSpec& e = s.model.moe;
  EXPECT_EQ(e.num_experts, 8);
  EXPECT_EQ(e.top_k, 2);
  EXPECT_EQ(e.expert_ffn_hidden_size, 64);
  EXPECT_EQ(e.num_shared_experts, 1);
  EXPECT_EQ(e.first_dense_layers, 1);
  EXPECT_EQ(e.router_score, RouterScoreKind::kSigmoid);
  EXPECT_DOUBLE_EQ(e.aux_loss_coef, 0.0);
  EXPECT_DOUBLE_EQ(e.bias_update_rate, 0.001);
  ASSERT_TRUE(e.capacity_factor.has_value());
  EXPECT_DOUBLE_EQ(*e.capacity_factor, 1.25);
  EXPECT_EQ(Errors(s), "");
  EXPECT_FALSE(s.model.IsMoeLayer(0));
  EXPECT_TRUE(s.model.IsMoeLayer(1));
  JobSpec again = Parse(ToYaml(s));
  EXPECT_EQ(ToYaml(again), ToYaml(s));
  EXPECT_DOUBLE_EQ(*again.model.moe.capacity_factor, 1.25);
  EXPECT_EQ(ToYaml(Parse(kValid)).find("moe"), std::string::npos);  // dense: not written
  s.model.moe.capacity_factor.reset();
  EXPECT_EQ(ToYaml(s).find("capacity_factor"), std::string::npos);  // dropless: not written
  yaml.replace(yaml.find("router_score: sigmoid"), 21, "router_score: relu");
  EXPECT_THAT(std::string(ParseJobSpecYaml(yaml, "job.yaml").status().message()),
              HasSubstr("model.moe.router_score=relu must be one of softmax | sigmoid"));
}

TEST(JobSpecRules, MoeRulesNameTheirFields) {
  JobSpec s = Parse(kValid);
  s.model.moe.num_experts = 4;
  s.model.moe.top_k = 5;
  s.model.moe.first_dense_layers = 4;
  s.model.moe.aux_loss_coef = -1;
  s.model.moe.bias_update_rate = -0.1;
  s.model.moe.capacity_factor = 0.0;
  s.model.moe.num_shared_experts = -1;
  const std::string errors = Errors(s);
  EXPECT_THAT(errors, HasSubstr("model.moe.top_k=5 must be between 1 and model.moe.num_experts=4"));
  EXPECT_THAT(errors, HasSubstr("model.moe.first_dense_layers=4 must be between 0 and "
                                "model.num_layers-1=3"));
  EXPECT_THAT(errors, HasSubstr("model.moe.aux_loss_coef=-1 must not be negative"));
  EXPECT_THAT(errors, HasSubstr("model.moe.bias_update_rate=-0.1 must not be negative"));
  EXPECT_THAT(errors, HasSubstr("model.moe.capacity_factor=0 must be positive"));
  EXPECT_THAT(errors, HasSubstr("model.moe.num_shared_experts=-1 must not be negative"));
  s = Parse(kValid);
  s.model.moe.num_experts = 6;
  s.parallelism.ep = 4;
  s.parallelism.dp = 1;
  s.resources.ranks = 4;
  EXPECT_THAT(Errors(s), HasSubstr("model.moe.num_experts=6 must be divisible by parallelism.ep=4"));
  s.model.moe.num_experts = 8;
  EXPECT_EQ(Errors(s), "");
  s.model.moe.num_experts = 5000;
  EXPECT_THAT(Errors(s), HasSubstr("model.moe.num_experts=5000 must be at most 4096"));
  // The engine runs the MoE layer under data parallelism only (for now).
  s = Parse(kValid);
  s.model.moe.num_experts = 4;
  Layout l = LayoutOf(s);
  EXPECT_TRUE(CheckEngineRuns(s, l).empty()) << ValidateEngineRuns(s, l);
  l.tp = 2;
  EXPECT_TRUE(CheckEngineRuns(s, l).empty()) << ValidateEngineRuns(s, l);
  l.sequence_parallel = true;
  EXPECT_THAT(std::string(ValidateEngineRuns(s, l).message()),
              HasSubstr("parallelism.sequence_parallel=true with model.moe and parallelism.tp=2"));
  l.sequence_parallel = false;
  l.tp = 1;
  l.pp = 2;
  EXPECT_TRUE(CheckEngineRuns(s, l).empty()) << ValidateEngineRuns(s, l);
  // Expert parallelism (docs/expert_parallel.md): any ZeRO stage, experts
  // divisible by ep; never for a dense model.
  l = LayoutOf(s);
  l.ep = 2;
  l.zero_stage = 1;
  EXPECT_TRUE(CheckEngineRuns(s, l).empty()) << ValidateEngineRuns(s, l);
  l.zero_stage = 3;
  EXPECT_TRUE(CheckEngineRuns(s, l).empty()) << ValidateEngineRuns(s, l);
  l.zero_stage = 0;
  l.ep = 3;
  EXPECT_THAT(std::string(ValidateEngineRuns(s, l).message()),
              HasSubstr("model.moe.num_experts=4 must be divisible by parallelism.ep=3"));
  // Not yet together: context and expert parallelism, refused naming both.
  l.ep = 2;
  l.cp = 2;
  EXPECT_THAT(std::string(ValidateEngineRuns(s, l).message()),
              HasSubstr("parallelism.cp=2 with parallelism.ep=2 is not supported by this engine yet"));
  l.cp = 1;
  EXPECT_TRUE(CheckEngineRuns(s, l).empty()) << ValidateEngineRuns(s, l);
  JobSpec dense = Parse(kValid);
  EXPECT_THAT(std::string(ValidateEngineRuns(dense, l).message()),
              HasSubstr("parallelism.ep=2 must be 1: the model has no experts"));
  // EP ranks read their own data: the global batch divides over dp x ep.
  s.parallelism.dp = 1;
  s.parallelism.ep = 4;
  s.resources.ranks = 4;
  s.train.global_batch_size = 4 * s.train.micro_batch_size + s.train.micro_batch_size;
  EXPECT_THAT(Errors(s), HasSubstr("must be divisible by parallelism.dp=1 x parallelism.ep=4 x "
                                   "train.micro_batch_size"));
  EXPECT_EQ(LayoutOf(s).grad_accum, s.train.global_batch_size / (4 * s.train.micro_batch_size));
}

// One descriptor per train.precision, named as the spec spells it.
TEST(PrecisionRecipe, OneEntryPerPrecision) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp8}) {
    const PrecisionRecipe& r = RecipeOf(p);
    EXPECT_EQ(r.precision, p);
    EXPECT_EQ(r.name, PrecisionName(p));
    EXPECT_EQ(r.bytes_per_value, 4);  // the engine keeps fp32 masters, gradients and states
    EXPECT_EQ(r.gemm, r.peak);
  }
  EXPECT_EQ(RecipeOf(Precision::kBf16).gemm, hardware::Dtype::kBf16);
  EXPECT_EQ(RecipeOf(Precision::kFp8).memory, MemoryRecipe::kLoomFp8Cast);
}

// The engine's limits on a resolved layout, each naming its field.
TEST(EngineRuns, RefusesWhatTheEngineCannotRunAndAcceptsTheComposedAxes) {
  JobSpec s = Parse(kValid);
  Layout l = LayoutOf(s);
  EXPECT_TRUE(CheckEngineRuns(s, l).empty());
  l.dp = 2;
  l.tp = 2;
  l.pp = 2;
  l.zero_stage = 2;
  l.sequence_parallel = true;
  EXPECT_TRUE(CheckEngineRuns(s, l).empty()) << ValidateEngineRuns(s, l);
  l.zero_stage = 3;  // ZeRO-3 under PP x DP x TP
  EXPECT_TRUE(CheckEngineRuns(s, l).empty()) << ValidateEngineRuns(s, l);
  l.zero_stage = 1;
  l.cp = 2;  // context parallelism composes with the others
  EXPECT_TRUE(CheckEngineRuns(s, l).empty()) << ValidateEngineRuns(s, l);
  l.cp = 1;
  l.ep = 2;
  l.tp = 3;
  const std::string refused(ValidateEngineRuns(s, l).message());
  EXPECT_THAT(refused, HasSubstr("parallelism.ep=2 must be 1: the model has no experts"));
  EXPECT_THAT(refused, HasSubstr("model.num_heads=4 must be divisible by parallelism.tp=3"));
  l = LayoutOf(s);
  l.cp = 3;  // the zigzag split needs 2 x cp chunks
  s.train.seq_len = 128;
  EXPECT_THAT(std::string(ValidateEngineRuns(s, l).message()),
              HasSubstr("train.seq_len=128 must be divisible by 2 x parallelism.cp=3"));
  l = LayoutOf(s);
  l.pp = 2;
  l.schedule = Schedule::kInterleaved;
  l.virtual_stages = 2;
  l.grad_accum = 3;
  EXPECT_THAT(std::string(ValidateEngineRuns(s, l).message()),
              HasSubstr("multiple of parallelism.pp=2"));
}

// The rules on a layout's own numbers, the same for submission, the engine
// and the planner's search (which calls them for every layout it keeps).
TEST(LayoutRules, ZeroBatchAndSchedule) {
  EXPECT_TRUE(CheckZeroStage(3).empty());
  EXPECT_THAT(CheckZeroStage(4),
              ::testing::ElementsAre("parallelism.zero_stage=4 must be 0, 1, 2 or 3"));
  Layout l;
  l.dp = 2;
  l.ep = 2;
  l.micro_batch_size = 2;
  EXPECT_TRUE(CheckBatchSplit(16, l).empty());
  ASSERT_EQ(CheckBatchSplit(12, l).size(), 1u);
  EXPECT_THAT(CheckBatchSplit(12, l)[0],
              HasSubstr("train.global_batch_size=12 must be divisible by parallelism.dp=2 x "
                        "parallelism.ep=2 x train.micro_batch_size=2"));
  l.micro_batch_size = 0;
  EXPECT_THAT(CheckBatchSplit(16, l)[0], HasSubstr("train.micro_batch_size=0 must be positive"));
  // Interleaved under a pipeline: two virtual stages at least, micro-batches
  // in groups of pp; the schedule means nothing without a pipeline.
  Layout p;
  p.pp = 2;
  p.schedule = Schedule::kInterleaved;
  p.virtual_stages = 2;
  p.grad_accum = 4;
  EXPECT_TRUE(CheckSchedule(p).empty());
  p.grad_accum = 3;
  EXPECT_THAT(CheckSchedule(p)[0], HasSubstr("multiple of parallelism.pp=2"));
  p.grad_accum = 4;
  p.virtual_stages = 1;
  EXPECT_THAT(CheckSchedule(p)[0],
              HasSubstr("parallelism.virtual_stages=1 must be at least 2 for "
                        "parallelism.schedule=interleaved"));
  p.pp = 1;
  p.grad_accum = 3;
  EXPECT_TRUE(CheckSchedule(p).empty());
}

TEST(JobSpecYaml, UnknownFieldNamesItsPath) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("num_kv_heads"), 12, "num_kv_head");
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml, "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("job.yaml: unknown field model.num_kv_head"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("num_kv_heads"));
}

TEST(JobSpecYaml, UnknownTopLevelSection) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(std::string(kValid) + "optimizer: {}\n", "j");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("unknown field optimizer"));
}

TEST(JobSpecYaml, WrongTypeNamesFieldAndValue) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("steps: 50"), 9, "steps: many");
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml, "j");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("train.steps=many must be an integer"));
}

TEST(JobSpecYaml, UnknownEnumListsChoices) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("schedule: 1f1b"), 14, "schedule: zigzag");
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml, "j");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("parallelism.schedule=zigzag must be one of afab | 1f1b | interleaved"));
}

TEST(JobSpecYaml, MalformedYaml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml("name: [unclosed", "bad.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("bad.yaml"));
}

TEST(JobSpecYaml, AutoParallelismAndOmittedAxes) {
  std::string yaml = kValid;
  const size_t start = yaml.find("parallelism:");
  const size_t end = yaml.find("resources:");
  yaml.replace(start, end - start, "parallelism: auto\n");
  JobSpec s = Parse(yaml);
  EXPECT_TRUE(s.parallelism.auto_all);
  EXPECT_FALSE(s.parallelism.dp.has_value());
  FillTrivialLayout(s);
  EXPECT_EQ(s.parallelism.dp, 2);
  EXPECT_EQ(s.parallelism.tp, 1);
}

TEST(JobSpecYaml, KvHeadsDefaultToHeads) {
  std::string yaml = kValid;
  yaml.replace(yaml.find(" num_kv_heads: 2,"), 17, "");
  EXPECT_EQ(Parse(yaml).model.num_kv_heads, 4);
}

TEST(JobSpecYaml, MissingFileNamesIt) {
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile("/nonexistent/job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("/nonexistent/job.yaml"));
}

// Each rule: a mutation of the valid spec and the message it must produce.
struct RuleCase {
  const char* name;
  void (*mutate)(JobSpec&);
  const char* message;
};

class JobSpecRules : public ::testing::TestWithParam<RuleCase> {};

TEST_P(JobSpecRules, ReportsFieldValueAndRule) {
  JobSpec s = Parse(kValid);
  GetParam().mutate(s);
  EXPECT_THAT(Errors(s), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    AllRules, JobSpecRules,
    ::testing::Values(
        RuleCase{"name", [](JobSpec& s) { s.name = "bad name!"; },
                 "name='bad name!' must be 1-63 characters"},
        RuleCase{"heads_tp",
                 [](JobSpec& s) {
                   s.model.num_heads = 12;
                   s.model.hidden_size = 120;
                   s.model.num_kv_heads = 12;
                   s.parallelism.tp = 5;
                 },
                 "model.num_heads=12 must be divisible by parallelism.tp=5"},
        RuleCase{"hidden_heads", [](JobSpec& s) { s.model.hidden_size = 130; },
                 "model.hidden_size=130 must be divisible by model.num_heads=4"},
        RuleCase{"odd_head_dim",
                 [](JobSpec& s) {
                   s.model.hidden_size = 132;
                   s.model.num_heads = 4;
                 },
                 "must give an even head dimension for RoPE"},
        RuleCase{"kv_heads", [](JobSpec& s) { s.model.num_kv_heads = 3; },
                 "model.num_heads=4 must be divisible by model.num_kv_heads=3"},
        RuleCase{"vocab", [](JobSpec& s) { s.model.vocab_size = 1; },
                 "model.vocab_size=1 must be at least 2"},
        RuleCase{"text_vocab", [](JobSpec& s) { s.model.vocab_size = 128; },
                 "model.vocab_size=128 must be at least 256 for data.format=text"},
        RuleCase{"layers", [](JobSpec& s) { s.model.num_layers = 0; },
                 "model.num_layers=0 must be positive"},
        RuleCase{"seq_len", [](JobSpec& s) { s.train.seq_len = 512; },
                 "train.seq_len=512 must not exceed model.max_seq_len=256"},
        RuleCase{"steps", [](JobSpec& s) { s.train.steps = 0; }, "train.steps=0 must be positive"},
        RuleCase{"lr", [](JobSpec& s) { s.train.lr = -1; }, "train.lr=-1 must be positive"},
        RuleCase{"warmup", [](JobSpec& s) { s.train.warmup_steps = 100; },
                 "train.warmup_steps=100 must be between 0 and train.steps=50"},
        RuleCase{"batch_micro", [](JobSpec& s) { s.train.micro_batch_size = 3; },
                 "train.global_batch_size=16 must be divisible by train.micro_batch_size=3"},
        RuleCase{"batch_dp",
                 [](JobSpec& s) {
                   s.train.global_batch_size = 12;
                   s.train.micro_batch_size = 4;
                 },
                 "train.global_batch_size=12 must be divisible by parallelism.dp=2 x "
                 "train.micro_batch_size=4"},
        RuleCase{"grad_clip", [](JobSpec& s) { s.train.grad_clip = -0.5; },
                 "train.grad_clip=-0.5 must not be negative"},
        RuleCase{"train_path", [](JobSpec& s) { s.data.train_path.clear(); },
                 "data.train_path='' is required"},
        RuleCase{"val_path", [](JobSpec& s) { s.data.val_path.clear(); },
                 "data.val_path='' is required when train.eval_interval=25"},
        RuleCase{"world",
                 [](JobSpec& s) { s.resources.ranks = 4; },
                 "parallelism=dp*tp*pp*cp*ep=2 must equal the number of ranks (4)"},
        RuleCase{"zero", [](JobSpec& s) { s.parallelism.zero_stage = 4; },
                 "parallelism.zero_stage=4 must be 0, 1, 2 or 3"},
        RuleCase{"virtual", [](JobSpec& s) { s.parallelism.virtual_stages = 2; },
                 "parallelism.virtual_stages=2 needs parallelism.schedule=interleaved"},
        RuleCase{"pp_layers",
                 [](JobSpec& s) {
                   s.parallelism.pp = 8;
                   s.parallelism.dp = 1;
                   s.resources.ranks = 8;
                 },
                 "model.num_layers=4 must be at least parallelism.pp=8"},
        RuleCase{"cp_seq",
                 [](JobSpec& s) {
                   s.parallelism.cp = 3;
                   s.train.seq_len = 129;
                 },
                 "train.seq_len=129 must be divisible by 2 x parallelism.cp=3"},
        RuleCase{"ep", [](JobSpec& s) { s.parallelism.ep = 2; },
                 "parallelism.ep=2 must be 1: the model has no experts (model.moe)"},
        RuleCase{"ffn_tp",
                 [](JobSpec& s) {
                   s.model.ffn_hidden_size = 385;
                   s.parallelism.tp = 2;
                 },
                 "model.ffn_hidden_size=385 must be divisible by parallelism.tp=2"},
        RuleCase{"keep", [](JobSpec& s) { s.checkpoint.keep = 0; },
                 "checkpoint.keep=0 must be positive"},
        RuleCase{"restarts", [](JobSpec& s) { s.fault_tolerance.max_restarts = -1; },
                 "fault_tolerance.max_restarts=-1 must not be negative"},
        RuleCase{"spike_factor", [](JobSpec& s) { s.fault_tolerance.loss_spike_factor = 0.5; },
                 "fault_tolerance.loss_spike_factor=0.5 must be 0 (off) or greater than 1"},
        RuleCase{"spike_needs_snapshots",
                 [](JobSpec& s) {
                   s.fault_tolerance.loss_spike_factor = 3;
                   s.fault_tolerance.snapshot_interval = 0;
                 },
                 "fault_tolerance.loss_spike_factor=3 needs fault_tolerance.snapshot_interval > 0"},
        RuleCase{"spike_window", [](JobSpec& s) { s.fault_tolerance.loss_spike_window = 2; },
                 "fault_tolerance.loss_spike_window=2 must be at least 3"},
        RuleCase{"bad_steps", [](JobSpec& s) { s.fault_tolerance.max_bad_steps = 0; },
                 "fault_tolerance.max_bad_steps=0 must be positive"},
        RuleCase{"max_runtime", [](JobSpec& s) { s.scheduling.max_runtime_s = -1; },
                 "scheduling.max_runtime_s=-1 must not be negative (0: not promised)"},
        RuleCase{"ranks", [](JobSpec& s) { s.resources.ranks = 0; },
                 "resources.ranks=0 must be positive"},
        RuleCase{"gpu_tp_node",
                 [](JobSpec& s) {
                   s.resources.device = DeviceKind::kGpu;
                   s.resources.gpu = "h100-sxm";
                   s.resources.nodes = 1;
                   s.resources.gpus_per_node = 6;
                   s.parallelism.tp = 4;
                   s.parallelism.dp = 1;
                   s.model.vocab_size = 256;
                 },
                 "parallelism.tp=4 must divide resources.gpus_per_node=6"}),
    [](const ::testing::TestParamInfo<RuleCase>& info) { return info.param.name; });

// A TP group may span whole nodes of one NVLink domain (docs/scheduling.md,
// "Node labels"): tp a multiple of gpus_per_node is allowed, a part of a node not.
TEST(JobSpecRules, TpSpansWholeNodesOrStaysInOne) {
  JobSpec s = Parse(kValid);
  s.resources.device = DeviceKind::kGpu;
  s.resources.gpu = "h100-sxm";
  s.resources.nodes = 2;
  s.resources.gpus_per_node = 2;
  s.parallelism.tp = 4;
  s.parallelism.dp = 1;
  s.parallelism.pp = 1;
  EXPECT_THAT(Errors(s), ::testing::Not(HasSubstr("parallelism.tp=4 must divide")));
  s.resources.gpus_per_node = 3;
  s.resources.nodes = 1;
  s.parallelism.tp = 3;
  EXPECT_THAT(Errors(s), ::testing::Not(HasSubstr("parallelism.tp=3 must divide")));
  s.resources.gpus_per_node = 6;
  s.parallelism.tp = 4;
  EXPECT_THAT(Errors(s), HasSubstr("parallelism.tp=4 must divide resources.gpus_per_node=6 (a TP "
                                   "group stays inside a node) or be a multiple of it"));
}

TEST(JobSpecRules, EveryPrecisionIsValidOnCpu) {
  // bf16 and fp8 are emulated on the CPU (docs/gpu.md), so no precision is
  // refused there.
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp8}) {
    JobSpec s = Parse(kValid);
    s.train.precision = precision;
    ASSERT_EQ(s.resources.device, DeviceKind::kCpu);
    EXPECT_EQ(Errors(s), "") << PrecisionName(precision);
  }
}

TEST(JobSpecRules, ReportsEveryBrokenRuleAtOnce) {
  JobSpec s = Parse(kValid);
  s.train.steps = 0;
  s.checkpoint.keep = 0;
  const std::string errors = Errors(s);
  EXPECT_THAT(errors, HasSubstr("train.steps=0"));
  EXPECT_THAT(errors, HasSubstr("checkpoint.keep=0"));
}

}  // namespace
}  // namespace loom::spec
