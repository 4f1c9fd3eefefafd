// Resolving a job's layout at submission and planning a spec for loomctl.
#include "planner/job_planner.h"

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

bool AllAxesGiven(const spec::ParallelismSpec& p) {
  return !p.auto_all && p.dp && p.tp && p.pp && p.cp && p.ep && p.zero_stage;
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

// A framework profile's constants, and its memory recipe: nanotron and
// Megatron keep bf16 working weights over an fp32 master copy (Transformer
// Engine for fp8), not Loom's fp32 weights cast per GEMM.
absl::Status ApplyProfile(std::string_view profile, PlanRequest& request) {
  absl::StatusOr<PlannerConstants> constants =
      ConstantsForProfile(profile, request.cluster.is_cpu);
  if (!constants.ok()) return constants.status();
  request.constants = *constants;
  request.space.allow_uneven_stages = profile == "nanotron";  // nanotron balances unevenly
  if (profile == "nanotron" || profile == "megatron") {
    RecipeKind& recipe = request.workload.recipe;
    if (recipe == RecipeKind::kLoomBf16Cast) recipe = RecipeKind::kBf16Fp32Accum;
    if (recipe == RecipeKind::kLoomFp8Cast) recipe = RecipeKind::kFp8TransformerEngine;
  }
  return absl::OkStatus();
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
                     " (loomctl plan shows layouts that fit)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveLayout(spec::JobSpec& spec) {
  if (AllAxesGiven(spec.parallelism)) {
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
