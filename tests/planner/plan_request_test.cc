// From job specs to planner requests: presets, recipes, fixed and free axes,
// and a chosen layout written back into the spec.
#include "planner/plan_request.h"

#include <set>
#include <string_view>

#include "gtest/gtest.h"

namespace loom::planner {
namespace {

spec::JobSpec CpuJob() {
  spec::JobSpec job;
  job.name = "tiny-llama";
  job.model.num_kv_heads = 2;
  job.train.global_batch_size = 16;
  job.train.micro_batch_size = 2;
  job.resources.device = spec::DeviceKind::kCpu;
  job.resources.ranks = 4;
  return job;
}

TEST(PlanRequestFromJob, CpuJobWithFixedAxes) {
  spec::JobSpec job = CpuJob();
  job.parallelism.dp = 2;
  job.parallelism.tp = 2;
  absl::StatusOr<PlanRequest> req = PlanRequestFromJob(job);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_TRUE(req->cluster.is_cpu);
  EXPECT_EQ(req->cluster.world_size(), 4);
  EXPECT_EQ(req->workload.recipe, RecipeKind::kFp32);
  EXPECT_EQ(req->workload.model.num_kv_heads, 2);
  EXPECT_EQ(req->space.dp, 2);
  EXPECT_EQ(req->space.tp, 2);
  EXPECT_FALSE(req->space.pp.has_value());
  EXPECT_EQ(req->space.micro_batch_size, 2);
  absl::StatusOr<PlanResult> plan = PlanLayouts(*req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->ranked.empty());
  const Layout& best = plan->ranked.front().layout;
  EXPECT_EQ(best.dp, 2);
  EXPECT_EQ(best.tp, 2);
  EXPECT_EQ(best.pp * best.cp, 1);
}

TEST(PlanRequestFromJob, AutoSearchesEverything) {
  spec::JobSpec job = CpuJob();
  job.parallelism.auto_all = true;
  job.parallelism.dp = 4;  // ignored under auto
  absl::StatusOr<PlanRequest> req = PlanRequestFromJob(job);
  ASSERT_TRUE(req.ok());
  EXPECT_FALSE(req->space.dp.has_value());
  EXPECT_FALSE(req->space.micro_batch_size.has_value());
  EXPECT_FALSE(req->space.recompute.has_value());
}

TEST(PlanRequestFromJob, MeasuredPeakOverridesCpuPreset) {
  ClusterOverrides o;
  o.peak_flops = 123e9;
  absl::StatusOr<PlanRequest> req = PlanRequestFromJob(CpuJob(), o);
  ASSERT_TRUE(req.ok());
  EXPECT_DOUBLE_EQ(req->cluster.PeakFlops(ComputeDtype::kFp32), 123e9);
  o.peak_flops = -1;
  absl::StatusOr<PlanRequest> bad = PlanRequestFromJob(CpuJob(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("peak_flops"), std::string::npos);
}

TEST(PlanRequestFromJob, GpuPresetAndRecipe) {
  spec::JobSpec job = CpuJob();
  job.resources.device = spec::DeviceKind::kGpu;
  job.resources.gpu = "h200";
  job.resources.nodes = 2;
  job.resources.gpus_per_node = 8;
  job.train.precision = spec::Precision::kBf16;
  absl::StatusOr<PlanRequest> req = PlanRequestFromJob(job);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->cluster.name, "h200");
  EXPECT_EQ(req->cluster.world_size(), 16);
  // What Loom's engine stores for bf16: fp32 states and activations, bf16
  // only inside each GEMM.
  EXPECT_EQ(req->workload.recipe, RecipeKind::kLoomBf16Cast);
  EXPECT_DOUBLE_EQ(Recipe(req->workload.recipe).total_bytes(), 16);
  EXPECT_DOUBLE_EQ(Recipe(req->workload.recipe).activation_bytes, 4);
  EXPECT_EQ(Recipe(req->workload.recipe).compute, ComputeDtype::kBf16);
  job.train.precision = spec::Precision::kFp8;
  absl::StatusOr<PlanRequest> fp8 = PlanRequestFromJob(job);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(fp8->workload.recipe, RecipeKind::kLoomFp8Cast);
  EXPECT_EQ(Recipe(fp8->workload.recipe).compute, ComputeDtype::kFp8);
  job.train.precision = spec::Precision::kBf16;

  job.resources.gpu = "tpu-v9";
  absl::StatusOr<PlanRequest> bad = PlanRequestFromJob(job);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("resources.gpu 'tpu-v9'"), std::string::npos) << bad.status();
}

TEST(ApplyLayout, WritesEveryAxis) {
  spec::JobSpec job = CpuJob();
  job.parallelism.auto_all = true;
  Layout l;
  l.dp = 2;
  l.pp = 2;
  l.zero_stage = 1;
  l.micro_batch_size = 4;
  l.grad_accum = 2;
  l.recompute = spec::Recompute::kFull;
  spec::ApplyLayout(l, &job);
  EXPECT_FALSE(job.parallelism.auto_all);
  EXPECT_EQ(job.parallelism.dp, 2);
  EXPECT_EQ(job.parallelism.tp, 1);
  EXPECT_EQ(job.parallelism.pp, 2);
  EXPECT_EQ(job.parallelism.zero_stage, 1);
  EXPECT_EQ(job.train.micro_batch_size, 4);
  EXPECT_EQ(job.parallelism.recompute, spec::Recompute::kFull);
}

TEST(Recipes, BytesPerParameterAndNames) {
  EXPECT_DOUBLE_EQ(Recipe(RecipeKind::kFp32).total_bytes(), 16);
  EXPECT_DOUBLE_EQ(Recipe(RecipeKind::kBf16).total_bytes(), 16);
  EXPECT_DOUBLE_EQ(Recipe(RecipeKind::kBf16Fp32Accum).total_bytes(), 20);
  // One row per kind, in the enum's order, each with its own name.
  std::set<std::string_view> names;
  for (size_t i = 0; i < AllRecipes().size(); ++i) {
    const PrecisionRecipe& r = AllRecipes()[i];
    EXPECT_EQ(static_cast<size_t>(r.kind), i) << r.name;
    EXPECT_EQ(&Recipe(r.kind), &r) << r.name;
    EXPECT_TRUE(names.insert(r.name).second) << r.name;
  }
  EXPECT_EQ(AllRecipes().size(), static_cast<size_t>(RecipeKind::kLoomFp8Cast) + 1);
  // train.precision names Loom's own recipes by value.
  EXPECT_EQ(RecipeForPrecision(spec::Precision::kFp32), RecipeKind::kFp32);
  EXPECT_EQ(RecipeForPrecision(spec::Precision::kBf16), RecipeKind::kLoomBf16Cast);
  EXPECT_EQ(RecipeForPrecision(spec::Precision::kFp8), RecipeKind::kLoomFp8Cast);
}

TEST(Clusters, PresetsAndFallbackPeaks) {
  for (const std::string& name : ClusterPresetNames()) EXPECT_TRUE(ClusterPreset(name).ok()) << name;
  const ClusterSpec a100 = *ClusterPreset("a100-80gb");
  EXPECT_DOUBLE_EQ(a100.PeakFlops(ComputeDtype::kFp8), 312e12);  // no fp8 units
  const ClusterSpec h100 = *ClusterPreset("h100-sxm");
  EXPECT_DOUBLE_EQ(h100.PeakFlops(ComputeDtype::kBf16), 989.5e12);
}

}  // namespace
}  // namespace loom::planner
