// PlanJob's answer on the wire: the planner's plan of a spec
// (planner/job_planner.h: PlanJobSpec, the same that `loomctl plan --offline`
// runs) as a loom.v1.PlanJobResponse, its candidates' layouts in their wire
// form. Resolving a submitted spec's layout is planner::ResolveLayout.
#pragma once

#include "absl/status/statusor.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

absl::StatusOr<loom::v1::PlanJobResponse> PlanJob(const loom::v1::PlanJobRequest& request);

}  // namespace loom::coordinator
