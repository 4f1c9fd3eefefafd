// The coordinator's use of the planner: resolve the axes a spec leaves open
// (at submission) and answer PlanJob with ranked candidates.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

// Fills every axis the spec leaves to the planner, or says why none fits.
absl::Status ResolveLayout(spec::JobSpec& spec);

absl::StatusOr<loom::v1::PlanJobResponse> PlanJob(const loom::v1::PlanJobRequest& request);

}  // namespace loom::coordinator
