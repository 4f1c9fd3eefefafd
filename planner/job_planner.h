// The planner as a job uses it. At submission, ResolveLayout fills what a
// spec leaves open (`parallelism: auto`, or any axis left out) with the
// fastest layout that fits and that the engine runs, or checks that a layout
// given in full fits; `loomctl plan` (online through the coordinator's PlanJob,
// or --offline) shows PlanJobSpec's ranked candidates, rendered as text and
// JSON. Pure: the callers own the I/O.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "nlohmann/json.hpp"
#include "planner/search.h"

namespace loom::planner {

// Resolves spec's layout in place: the axes it leaves to the planner get the
// fastest layout that fits and that passes the spec's rules and the engine's
// (spec::CheckJobSpec, spec::CheckEngineRuns); a layout given in full must fit
// in memory. Then the engine must run the result (spec::ValidateEngineRuns).
// Errors: INVALID_ARGUMENT naming the rule, RESOURCE_EXHAUSTED when no layout
// fits (with the closest one's reason).
absl::Status ResolveLayout(spec::JobSpec& spec);

struct PlanOptions {
  // Whose implementation constants the estimates use: "" or "loom" (Loom's
  // engine), "nanotron" or "megatron" (GPU jobs only).
  std::string profile;
  int max_candidates = 5;  // layouts shown; below 1: 5
};

struct JobPlan {
  PlanRequest request;
  PlanResult result;
  int shown = 0;       // how many of result.ranked the text and JSON show
  std::string text;    // what `loomctl plan` prints
  nlohmann::json json;  // the same, for programs (`--format=json`)
};

// The plan of a spec as written: parsed and checked (spec::ValidateJobSpec),
// then every layout the model predicts, including those the engine cannot
// run yet (submission is what restricts them). Errors name `source_name`.
absl::StatusOr<JobPlan> PlanJobSpec(std::string_view spec_yaml, std::string_view source_name,
                                    const PlanOptions& options = {});

}  // namespace loom::planner
