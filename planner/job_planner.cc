// Resolving a job's layout at submission and planning a spec for loomctl.
#include "planner/job_planner.h"

#include <cmath>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/layout.h"
#include "planner/plan_request.h"
#include "planner/render.h"

namespace loom::planner {
namespace {

// Nothing left to search: every axis and the micro-batch size given.
bool AllAxesGiven(const spec::JobSpec& spec) {
  const spec::ParallelismSpec& p = spec.parallelism;
  return !p.auto_all && p.dp && p.tp && p.pp && p.cp && p.ep && p.zero_stage &&
         !spec.train.micro_batch_size_auto;
}

// `auto` searches every layout the engine runs: every tp (with and without
// sequence parallelism), pp (with each schedule) and ZeRO stage that passes
// the spec's rules and the engine's (spec::CheckJobSpec and
// spec::CheckEngineRuns, checked on the spec as it would be stored); cp and
// ep, which the search would otherwise try, stay 1 unless the spec sets them.
void RestrictToEngine(const spec::JobSpec& job, SearchSpace& space) {
  if (!space.cp) space.cp = 1;
  if (!space.ep) space.ep = 1;
  space.search_schedules = job.parallelism.auto_all;
  space.accept = [job](const Layout& layout) {
    spec::JobSpec resolved = job;
    spec::ApplyLayout(layout, &resolved);
    return spec::CheckJobSpec(resolved).empty() &&
           spec::CheckEngineRuns(resolved, layout).empty();
  };
}

// What a framework runs, beside what every layout needs: nanotron's optimizer
// shards at most ZeRO-1 (no ZeRO-2 or -3) and its pipeline engines are
// all-forward-all-backward and 1F1B (no interleaving).
struct FrameworkRules {
  int max_zero_stage = 3;
  bool interleaved = true;
};

FrameworkRules RulesOfProfile(std::string_view profile) {
  if (profile == "nanotron") return {1, false};
  return {};
}

// A framework profile's constants, its rules, and its memory recipe: nanotron
// and Megatron keep bf16 working weights over an fp32 master copy (Transformer
// Engine for fp8), not Loom's fp32 weights cast per GEMM. A spec that fixes
// what the framework does not run is refused, naming the field.
absl::Status ApplyProfile(std::string_view profile, PlanRequest& request) {
  absl::StatusOr<PlannerConstants> constants =
      ConstantsForProfile(profile, request.cluster.is_cpu);
  if (!constants.ok()) return constants.status();
  request.constants = *constants;
  SearchSpace& space = request.space;
  space.allow_uneven_stages = profile == "nanotron";  // nanotron balances unevenly
  const FrameworkRules rules = RulesOfProfile(profile);
  if (space.zero_stage && *space.zero_stage > rules.max_zero_stage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.zero_stage=", *space.zero_stage, " is not run by --profile=",
        std::string(profile), " (ZeRO stages 0-", rules.max_zero_stage, ")"));
  }
  if (!rules.interleaved && space.schedule == spec::Schedule::kInterleaved) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.schedule=interleaved is not run by --profile=", std::string(profile),
        " (afab or 1f1b)"));
  }
  space.max_zero_stage = std::min(space.max_zero_stage, rules.max_zero_stage);
  space.allow_interleaved = space.allow_interleaved && rules.interleaved;
  if (profile == "nanotron" || profile == "megatron") {
    RecipeKind& recipe = request.workload.recipe;
    if (recipe == RecipeKind::kLoomBf16Cast) recipe = RecipeKind::kBf16Fp32Accum;
    if (recipe == RecipeKind::kLoomFp8Cast) recipe = RecipeKind::kFp8TransformerEngine;
  }
  return absl::OkStatus();
}

// When a layout given in full runs out of memory at its micro-batch size,
// the largest one that fits with every axis held, as a hint.
std::string FittingMicroBatchHint(const spec::JobSpec& spec, PlanRequest request) {
  request.space.micro_batch_size.reset();
  RestrictToEngine(spec, request.space);
  absl::StatusOr<PlanResult> result = PlanLayouts(request);
  if (!result.ok()) return "";
  int64_t best = 0;
  for (const Candidate& c : result->ranked) best = std::max(best, c.layout.micro_batch_size);
  if (best == 0) return "";
  return absl::StrCat("; train.micro_batch_size=", best,
                      " fits with these axes (micro_batch_size: auto lets the planner choose)");
}

// A layout the user gave in full is not searched, but it must still fit: a
// rank that runs out of memory fails only after the job was placed, started
// and restarted through its whole budget.
absl::Status CheckGivenLayoutFits(const spec::JobSpec& spec) {
  absl::StatusOr<PlanRequest> request = PlanRequestFromJob(spec);
  if (!request.ok()) return request.status();
  const Layout layout = spec::LayoutOf(spec);
  const MemoryBreakdown memory =
      EstimateMemory(request->workload, layout, request->constants);
  if (std::optional<Rejection> rejected = CheckFits(request->cluster, layout, memory)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the layout given in parallelism does not fit in memory: ", rejected->Reason(),
                     FittingMicroBatchHint(spec, *request), " (loomctl plan shows layouts that fit)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveLayout(spec::JobSpec& spec) {
  if (AllAxesGiven(spec)) {
    if (absl::Status s = CheckGivenLayoutFits(spec); !s.ok()) return s;
  } else {
    absl::StatusOr<PlanRequest> request = PlanRequestFromJob(spec);
    if (!request.ok()) return request.status();
    RestrictToEngine(spec, request->space);
    absl::StatusOr<PlanResult> result = PlanLayouts(*request);
    if (!result.ok()) return result.status();
    if (result->ranked.empty()) {
      const std::string reason = result->rejected.empty() ? "no layout is valid"
                                                          : result->rejected.front().Reason();
      return absl::ResourceExhaustedError(absl::StrCat(
          "no layout of ", spec.resources.world_size(), " ranks fits in memory: ", reason));
    }
    spec::ApplyLayout(result->ranked.front().layout, &spec);
  }
  return spec::ValidateEngineRuns(spec, spec::LayoutOf(spec));
}

absl::StatusOr<double> PredictStepSeconds(const spec::JobSpec& resolved) {
  absl::StatusOr<PlanRequest> request = PlanRequestFromJob(resolved);
  if (!request.ok()) return request.status();
  const StepTime time = EstimateStepTime(request->workload, spec::LayoutOf(resolved),
                                         request->cluster, request->constants);
  if (!(time.total > 0) || !std::isfinite(time.total)) {
    return absl::FailedPreconditionError("the time model predicts no time for this layout");
  }
  return time.total;
}

absl::StatusOr<spec::JobSpec> ReplanOnRanks(const spec::JobSpec& job, int64_t ranks) {
  spec::JobSpec out = job;
  spec::ResourcesSpec& r = out.resources;
  if (ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot re-plan job ", job.name, " onto ", ranks, " ranks"));
  }
  if (r.device == spec::DeviceKind::kCpu) {
    r.ranks = ranks;
  } else {
    if (r.gpus_per_node < 1 || ranks % r.gpus_per_node != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot re-plan job ", job.name, " onto ", ranks,
          " GPUs: whole nodes of resources.gpus_per_node=", r.gpus_per_node, " are needed"));
    }
    r.nodes = ranks / r.gpus_per_node;
  }
  const spec::Layout before = spec::LayoutOf(job);
  out.parallelism.auto_all = true;
  absl::StatusOr<PlanRequest> request = PlanRequestFromJob(out);
  if (!request.ok()) return request.status();
  RestrictToEngine(out, request->space);
  // Axes the job already used are searched again rather than dropped to 1.
  if (before.cp > 1) request->space.cp.reset();
  if (before.ep > 1) request->space.ep.reset();
  absl::StatusOr<PlanResult> result = PlanLayouts(*request);
  if (!result.ok()) return result.status();
  if (result->ranked.empty()) {
    const std::string reason = result->rejected.empty() ? "no layout is valid"
                                                        : result->rejected.front().Reason();
    return absl::ResourceExhaustedError(absl::StrCat(
        "no layout of ", ranks, " ranks keeping train.global_batch_size=",
        job.train.global_batch_size, " fits in memory: ", reason));
  }
  spec::ApplyLayout(result->ranked.front().layout, &out);
  if (absl::Status s = spec::ValidateEngineRuns(out, spec::LayoutOf(out)); !s.ok()) return s;
  return out;
}

absl::StatusOr<JobPlan> PlanJobSpec(std::string_view spec_yaml, std::string_view source_name,
                                    const PlanOptions& options) {
  const std::string source = source_name.empty() ? "job spec" : std::string(source_name);
  auto failed = [&source](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
  };
  absl::StatusOr<spec::JobSpec> spec = spec::ParseJobSpecYaml(spec_yaml, source);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = spec::ValidateJobSpec(*spec); !s.ok()) return failed(s);
  absl::StatusOr<PlanRequest> request = PlanRequestFromJob(*spec);
  if (!request.ok()) return failed(request.status());
  const bool loom = options.profile.empty() || options.profile == "loom";
  if (!options.profile.empty()) {
    if (absl::Status s = ApplyProfile(options.profile, *request); !s.ok()) return failed(s);
  }
  absl::StatusOr<PlanResult> result = PlanLayouts(*request);
  if (!result.ok()) return failed(result.status());

  JobPlan plan;
  plan.request = *std::move(request);
  plan.result = *std::move(result);
  const int wanted = options.max_candidates > 0 ? options.max_candidates : 5;
  plan.shown = std::min(wanted, static_cast<int>(plan.result.ranked.size()));
  RenderOptions render;
  render.runners_up = wanted - 1;
  plan.text = absl::StrCat(loom ? "" : absl::StrCat("Framework profile: ", options.profile, "\n"),
                           RenderPlanText(plan.request, plan.result, render));
  plan.json = PlanToJson(plan.request, plan.result, render);
  return plan;
}

}  // namespace loom::planner
