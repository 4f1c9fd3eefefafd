#include "coordinator/service/plan_service.h"

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "coordinator/jobs/layout_proto.h"

namespace loom::coordinator {

absl::Status ResolveLayout(spec::JobSpec& spec) {
  spec::FillTrivialLayout(spec);
  return absl::OkStatus();
}

absl::StatusOr<loom::v1::PlanJobResponse> PlanJob(const loom::v1::PlanJobRequest& request) {
  const std::string source = request.source_name().empty() ? "job spec" : request.source_name();
  absl::StatusOr<spec::JobSpec> spec = spec::ParseJobSpecYaml(request.spec_yaml(), source);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = spec::ValidateJobSpec(*spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  if (absl::Status s = ResolveLayout(*spec); !s.ok()) return s;
  loom::v1::PlanJobResponse response;
  loom::v1::PlanCandidate* candidate = response.add_candidates();
  *candidate->mutable_layout() = LayoutOf(*spec);
  candidate->set_fits(true);
  response.set_layouts_considered(1);
  return response;
}

}  // namespace loom::coordinator
