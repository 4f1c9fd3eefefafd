// loomctl plan: the coordinator's plan for a job spec (PlanJob), the same
// planner call here with --offline, or the playbook's sweep with --sweep.
#include <cstdio>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/loomctl_context.h"
#include "client/loomctl_verbs.h"
#include "common/cli/parse_flags.h"
#include "common/rpc/rpc_settings.h"
#include "planner/cluster.h"
#include "planner/job_planner.h"
#include "planner/sweep.h"

ABSL_FLAG(bool, offline, false, "plan: run the planner here instead of asking the coordinator");
ABSL_FLAG(int32_t, candidates, 5, "plan: how many layouts to show");
ABSL_FLAG(std::string, profile, "loom",
          "plan: the framework the estimates model: loom (this engine), nanotron or megatron");
ABSL_FLAG(bool, sweep, false,
          "plan: the best layout per (model size, node count) cell, like the Ultra-Scale Playbook");
ABSL_FLAG(std::string, svg, "loom-plan-sweep.svg", "plan --sweep: where to write the heatmap SVG");
ABSL_FLAG(std::string, gpu, "h100-sxm", "plan --sweep: cluster preset");

namespace loom::client {
namespace {

// The playbook's grid of model sizes and node counts, best layout per cell.
int Sweep() {
  absl::StatusOr<loom::planner::ClusterSpec> cluster =
      loom::planner::ClusterPreset(absl::GetFlag(FLAGS_gpu));
  if (!cluster.ok()) return Fail(std::string(cluster.status().message()));
  absl::StatusOr<loom::planner::SweepResult> result =
      loom::planner::RunSweep(loom::planner::PlaybookSweep(*cluster));
  if (!result.ok()) return Fail(std::string(result.status().message()));
  if (absl::GetFlag(FLAGS_format) == "json") {
    std::printf("%s\n", loom::planner::SweepToJson(*result).dump(2).c_str());
  } else {
    std::printf("%s", loom::planner::RenderSweepTable(*result).c_str());
  }
  const std::string svg = absl::GetFlag(FLAGS_svg);
  std::ofstream out(svg);
  out << loom::planner::RenderSweepSvg(*result);
  if (!out) return Fail(absl::StrCat("cannot write ", svg));
  std::fprintf(stderr, "heatmap written to %s\n", svg.c_str());
  return 0;
}

}  // namespace

// The coordinator's plan (PlanJob), or --offline the same planner call here
// (planner::PlanJobSpec, which the coordinator's PlanJob runs too).
int RunPlan(const Args& args) {
  RequireFormat("plan", {"text", "json"});
  if (absl::GetFlag(FLAGS_sweep)) {
    if (args.size() != 1) loom::cli::UsageError("plan --sweep takes no job spec");
    return Sweep();
  }
  if (args.size() != 2) loom::cli::UsageError("plan needs JOB.yaml (or --sweep)");
  const std::string& path = args[1];
  loom::v1::PlanJobRequest request;
  if (!ReadFile(path, request.mutable_spec_yaml())) {
    return Fail(absl::StrCat("cannot read job spec ", path));
  }
  request.set_source_name(path);
  request.set_max_candidates(absl::GetFlag(FLAGS_candidates));
  request.set_profile(absl::GetFlag(FLAGS_profile));
  std::string text, json;
  if (absl::GetFlag(FLAGS_offline)) {
    loom::planner::PlanOptions options;
    options.profile = request.profile();
    options.max_candidates = request.max_candidates();
    absl::StatusOr<loom::planner::JobPlan> plan =
        loom::planner::PlanJobSpec(request.spec_yaml(), request.source_name(), options);
    if (!plan.ok()) return Fail(std::string(plan.status().message()));
    text = plan->text;
    json = plan->json.dump(2);
  } else {
    loom::v1::PlanJobResponse response;
    auto context = loom::rpc::UnaryContext();
    grpc::Status status = Stub()->PlanJob(context.get(), request, &response);
    if (!status.ok()) return RpcFail(status);
    text = response.text();
    json = response.json();
  }
  if (absl::GetFlag(FLAGS_format) == "json") {
    std::printf("%s\n", json.c_str());
  } else {
    std::printf("%s", text.c_str());
  }
  return 0;
}

}  // namespace loom::client
