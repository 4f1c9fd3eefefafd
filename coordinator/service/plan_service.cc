#include "coordinator/service/plan_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "common/spec/layout.h"
#include "coordinator/jobs/layout_proto.h"
#include "coordinator/planner/plan_request.h"
#include "coordinator/planner/render.h"
#include "coordinator/planner/search.h"

namespace loom::coordinator {
namespace {

bool AllAxesGiven(const spec::ParallelismSpec& p) {
  return !p.auto_all && p.dp && p.tp && p.pp && p.cp && p.ep && p.zero_stage;
}

// `auto` searches every layout the engine runs: every tp (with and without
// sequence parallelism), pp (with each schedule) and ZeRO stage that passes the spec's rules and the engine's
// (spec::CheckJobSpec and spec::CheckEngineRuns, checked on the spec as it
// would be stored); cp and ep, which the engine refuses, stay 1.
void RestrictToEngine(const spec::JobSpec& job, planner::SearchSpace& space) {
  if (!space.cp) space.cp = 1;
  if (!space.ep) space.ep = 1;
  space.search_schedules = job.parallelism.auto_all;
  space.accept = [job](const planner::Layout& layout) {
    spec::JobSpec resolved = job;
    spec::ApplyLayout(layout, &resolved);
    return spec::CheckJobSpec(resolved).empty() &&
           spec::CheckEngineRuns(resolved, layout).empty();
  };
}

absl::StatusOr<std::pair<planner::PlanRequest, planner::PlanResult>> Search(
    const spec::JobSpec& spec, bool restrict_to_engine, std::string_view profile = "") {
  absl::StatusOr<planner::PlanRequest> request = planner::PlanRequestFromJob(spec);
  if (!request.ok()) return request.status();
  if (restrict_to_engine) RestrictToEngine(spec, request->space);
  if (!profile.empty()) {
    absl::StatusOr<planner::PlannerConstants> constants =
        planner::ConstantsForProfile(profile, request->cluster.is_cpu);
    if (!constants.ok()) return constants.status();
    request->constants = *constants;
    request->space.allow_uneven_stages = profile == "nanotron";  // nanotron balances unevenly
    if (profile == "nanotron" || profile == "megatron") {
      // Those frameworks keep bf16 working weights over an fp32 master copy
      // (Transformer Engine for fp8), not Loom's fp32 weights cast per GEMM.
      planner::RecipeKind& recipe = request->workload.recipe;
      if (recipe == planner::RecipeKind::kLoomBf16Cast) recipe = planner::RecipeKind::kBf16Fp32Accum;
      if (recipe == planner::RecipeKind::kLoomFp8Cast) {
        recipe = planner::RecipeKind::kFp8TransformerEngine;
      }
    }
  }
  absl::StatusOr<planner::PlanResult> result = planner::PlanLayouts(*request);
  if (!result.ok()) return result.status();
  return std::make_pair(*std::move(request), *std::move(result));
}

void AddMemory(loom::v1::PlanCandidate& c, const planner::MemoryBreakdown& m) {
  const std::pair<const char*, double> items[] = {
      {"weights", m.weights},           {"gradients", m.gradients},
      {"optimizer", m.optimizer},       {"activations", m.activations},
      {"logits", m.logits},             {"zero3_gathered", m.zero3_gathered},
      {"comm_buffers", m.comm_buffers}, {"overhead", m.overhead}};
  for (const auto& [name, bytes] : items) {
    loom::v1::MemoryItem* item = c.add_memory();
    item->set_name(name);
    item->set_bytes(static_cast<int64_t>(bytes));
  }
  c.set_memory_bytes(static_cast<int64_t>(m.total()));
}

}  // namespace

absl::Status CheckEngineSupports(const spec::JobSpec& s) {
  return spec::ValidateEngineRuns(s, spec::LayoutOf(s));
}

// A layout the user gave in full is not searched, but it must still fit: a
// rank that runs out of memory fails only after the job was placed, started
// and restarted through its whole budget.
absl::Status CheckGivenLayoutFits(const spec::JobSpec& spec) {
  absl::StatusOr<planner::PlanRequest> request = planner::PlanRequestFromJob(spec);
  if (!request.ok()) return request.status();
  const planner::Layout layout = spec::LayoutOf(spec);
  const planner::Candidate candidate = planner::EvaluateLayout(
      request->workload, request->cluster, request->constants, layout);
  if (candidate.memory.total() <= request->cluster.memory_bytes) return absl::OkStatus();
  const planner::Rejection rejection{layout, candidate.memory, request->cluster.memory_bytes};
  return absl::ResourceExhaustedError(
      absl::StrCat("the layout given in parallelism does not fit in memory: ", rejection.Reason(),
                   " (loomctl plan shows layouts that fit)"));
}

absl::Status ResolveLayout(spec::JobSpec& spec) {
  if (AllAxesGiven(spec.parallelism)) {
    if (absl::Status s = CheckGivenLayoutFits(spec); !s.ok()) return s;
  } else {
    auto searched = Search(spec, /*restrict_to_engine=*/true);
    if (!searched.ok()) return searched.status();
    const planner::PlanResult& result = searched->second;
    if (result.ranked.empty()) {
      std::string reason = result.rejected.empty() ? "no layout is valid"
                                                   : result.rejected.front().Reason();
      return absl::ResourceExhaustedError(
          absl::StrCat("no layout of ", spec.resources.world_size(),
                       " ranks fits in memory: ", reason));
    }
    spec::ApplyLayout(result.ranked.front().layout, &spec);
  }
  return CheckEngineSupports(spec);
}

absl::StatusOr<loom::v1::PlanJobResponse> PlanJob(const loom::v1::PlanJobRequest& request) {
  const std::string source = request.source_name().empty() ? "job spec" : request.source_name();
  absl::StatusOr<spec::JobSpec> spec = spec::ParseJobSpecYaml(request.spec_yaml(), source);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = spec::ValidateJobSpec(*spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  // The plan shows what the model predicts for every layout, including those
  // the engine cannot run yet; submission is what restricts them.
  auto searched = Search(*spec, /*restrict_to_engine=*/false, request.profile());
  if (!searched.ok()) {
    return absl::Status(searched.status().code(),
                        absl::StrCat(source, ": ", searched.status().message()));
  }
  const auto& [plan_request, result] = *searched;
  const int shown = request.max_candidates() > 0 ? request.max_candidates() : 5;
  planner::RenderOptions options;
  options.runners_up = shown - 1;
  loom::v1::PlanJobResponse response;
  for (int i = 0; i < static_cast<int>(result.ranked.size()) && i < shown; ++i) {
    const planner::Candidate& c = result.ranked[i];
    loom::v1::PlanCandidate* out = response.add_candidates();
    *out->mutable_layout() = LayoutToProto(c.layout);
    out->set_fits(true);
    AddMemory(*out, c.memory);
    out->set_step_seconds(c.time.total);
    out->set_tokens_per_second(c.time.tokens_per_second);
    out->set_mfu(c.time.mfu);
    out->set_bubble_fraction(c.time.bubble_fraction);
  }
  response.set_layouts_considered(result.layouts_considered);
  response.set_layouts_rejected(static_cast<int64_t>(result.rejected.size()));
  response.set_text(absl::StrCat(
      request.profile().empty() || request.profile() == "loom" ? "" : absl::StrCat("Framework profile: ", request.profile(), "\n"),
      planner::RenderPlanText(plan_request, result, options)));
  response.set_json(planner::PlanToJson(plan_request, result, options).dump(2));
  return response;
}

}  // namespace loom::coordinator
