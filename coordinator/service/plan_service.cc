#include "coordinator/service/plan_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "coordinator/planner/plan_request.h"
#include "coordinator/planner/render.h"
#include "coordinator/planner/search.h"

namespace loom::coordinator {
namespace {

bool AllAxesGiven(const spec::ParallelismSpec& p) {
  return !p.auto_all && p.dp && p.tp && p.pp && p.cp && p.ep && p.zero_stage;
}

// `auto` searches data parallelism only (the layouts every engine feature
// supports), so it never answers with a layout the ranks refuse; tp and pp are
// used when the user sets them.
void RestrictToEngine(planner::SearchSpace& space) {
  if (!space.tp) space.tp = 1;
  if (!space.pp) space.pp = 1;
  if (!space.cp) space.cp = 1;
  if (!space.ep) space.ep = 1;
}

absl::StatusOr<std::pair<planner::PlanRequest, planner::PlanResult>> Search(
    const spec::JobSpec& spec, bool restrict_to_engine) {
  absl::StatusOr<planner::PlanRequest> request = planner::PlanRequestFromJob(spec);
  if (!request.ok()) return request.status();
  if (restrict_to_engine) RestrictToEngine(request->space);
  absl::StatusOr<planner::PlanResult> result = planner::PlanLayouts(*request);
  if (!result.ok()) return result.status();
  return std::make_pair(*std::move(request), *std::move(result));
}

loom::v1::Layout ToProto(const planner::Layout& l) {
  loom::v1::Layout out;
  out.set_dp(l.dp);
  out.set_tp(l.tp);
  out.set_pp(l.pp);
  out.set_cp(l.cp);
  out.set_ep(l.ep);
  out.set_zero_stage(l.zero_stage);
  out.set_schedule(spec::ScheduleName(l.schedule));
  out.set_virtual_stages(l.virtual_stages);
  out.set_sequence_parallel(l.sequence_parallel);
  out.set_recompute(spec::RecomputeName(l.recompute));
  out.set_micro_batch_size(l.micro_batch_size);
  out.set_grad_accum_steps(l.grad_accum);
  return out;
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
  std::vector<std::string> unsupported;
  const spec::ParallelismSpec& p = s.parallelism;
  const int64_t dp = p.dp.value_or(1), tp = p.tp.value_or(1), pp = p.pp.value_or(1);
  const int64_t zero = p.zero_stage.value_or(0);
  for (const auto& [name, value] : {std::pair{"cp", p.cp.value_or(1)}, std::pair{"ep", p.ep.value_or(1)}}) {
    if (value != 1) {
      unsupported.push_back(absl::StrCat("parallelism.", name, "=", value,
                                         " is not supported by this engine yet (use 1)"));
    }
  }
  // ZeRO 1-3 run under TP, ZeRO 1-2 under PP (with DP), tied embeddings
  // under PP; a pipeline stage keeps its parameters, so not ZeRO-3.
  if (pp > 1) {
    if (zero == 3 && dp > 1) {
      unsupported.push_back(absl::StrCat("parallelism.pp=", pp,
                                         " with parallelism.zero_stage=3 is not supported by this "
                                         "engine (use zero_stage 0, 1 or 2)"));
    }
    const int64_t micro = s.train.global_batch_size / std::max<int64_t>(1, s.train.micro_batch_size * dp);
    if (p.schedule == spec::Schedule::kInterleaved && micro % pp != 0) {
      unsupported.push_back(absl::StrCat(
          "parallelism.schedule=interleaved needs the micro-batches per step (", micro,
          " = train.global_batch_size / (train.micro_batch_size x parallelism.dp)) to be a "
          "multiple of parallelism.pp=", pp));
    }
  }
  if (unsupported.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(unsupported, "; "));
}

// A layout the user gave in full is not searched, but it must still fit: a
// rank that runs out of memory fails only after the job was placed, started
// and restarted through its whole budget.
absl::Status CheckGivenLayoutFits(const spec::JobSpec& spec) {
  absl::StatusOr<planner::PlanRequest> request = planner::PlanRequestFromJob(spec);
  if (!request.ok()) return request.status();
  const spec::ParallelismSpec& p = spec.parallelism;
  planner::Layout layout;
  layout.dp = *p.dp;
  layout.tp = *p.tp;
  layout.pp = *p.pp;
  layout.cp = *p.cp;
  layout.ep = *p.ep;
  layout.zero_stage = static_cast<int>(*p.zero_stage);
  layout.micro_batch_size = spec.train.micro_batch_size;
  const int64_t per_step = std::max<int64_t>(1, layout.dp * layout.micro_batch_size);
  layout.grad_accum = std::max<int64_t>(1, spec.train.global_batch_size / per_step);
  layout.schedule = p.schedule;
  layout.virtual_stages = p.virtual_stages;
  layout.sequence_parallel = p.sequence_parallel;
  layout.recompute = p.recompute;
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
    planner::ApplyLayoutToJob(result.ranked.front().layout, &spec);
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
  auto searched = Search(*spec, /*restrict_to_engine=*/false);
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
    *out->mutable_layout() = ToProto(c.layout);
    out->set_fits(true);
    AddMemory(*out, c.memory);
    out->set_step_seconds(c.time.total);
    out->set_tokens_per_second(c.time.tokens_per_second);
    out->set_mfu(c.time.mfu);
    out->set_bubble_fraction(c.time.bubble_fraction);
  }
  response.set_layouts_considered(result.layouts_considered);
  response.set_layouts_rejected(static_cast<int64_t>(result.rejected.size()));
  response.set_text(planner::RenderPlanText(plan_request, result, options));
  response.set_json(planner::PlanToJson(plan_request, result, options).dump(2));
  return response;
}

}  // namespace loom::coordinator
