// The planner as a job uses it. At submission, ResolveLayout fills what a
// spec leaves open (`parallelism: auto`, or any axis left out) with the
// fastest layout that fits and that the engine runs, or checks that a layout
// given in full fits; `loomctl plan` (online through the coordinator's PlanJob,
// or --offline) shows PlanJobSpec's ranked candidates, rendered as text and
// JSON. Pure: the callers own the I/O.
#pragma once

#include <cstdint>
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

// The job re-planned onto `ranks` devices, what an elastic job shrinks to
// when it lost devices and grows back with (docs/fault_tolerance.md): the same
// model, data, precision and global batch (fewer data-parallel ranks take more
// gradient accumulation, so the loss trajectory stays the same); every axis,
// the micro-batch size, the ZeRO stage and the schedule searched again as for
// `parallelism: auto`, restricted by the spec's rules, the engine's and
// memory (cp and ep are searched when the job used them, else 1). A GPU job
// needs whole nodes. Errors: INVALID_ARGUMENT for a size it cannot take,
// RESOURCE_EXHAUSTED when no layout of that size fits (with the reason).
absl::StatusOr<spec::JobSpec> ReplanOnRanks(const spec::JobSpec& job, int64_t ranks);

// The time model's prediction of one training step of `resolved` (its
// layout given in full, as admission leaves it), in seconds: what the
// scheduler multiplies by the steps left to estimate how long a job that
// promised no runtime will run (EASY backfill, docs/scheduling.md). Errors as
// the plan request's; FAILED_PRECONDITION when the model predicts no time.
absl::StatusOr<double> PredictStepSeconds(const spec::JobSpec& resolved);

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
