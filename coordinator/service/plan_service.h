// The coordinator's use of the planner: resolve the axes a spec leaves open
// (at submission) within what this version's engine can run, and answer
// PlanJob with ranked candidates, their memory and predicted speed.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

// OK when the engine of this version can run the spec's layout
// (spec::ValidateEngineRuns on spec::LayoutOf(spec)); else INVALID_ARGUMENT
// naming each field it cannot run yet.
absl::Status CheckEngineSupports(const spec::JobSpec& spec);

// Fills every axis the spec leaves to the planner with the fastest layout
// that fits and that the engine supports, or says why none does.
absl::Status ResolveLayout(spec::JobSpec& spec);

absl::StatusOr<loom::v1::PlanJobResponse> PlanJob(const loom::v1::PlanJobRequest& request);

}  // namespace loom::coordinator
