// The rules a job spec must satisfy, checked before anything is stored.
// Each broken rule becomes one message naming the field path, its value and the
// rule, e.g. "model.num_heads=12 must be divisible by parallelism.tp=5".
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"
#include "common/spec/layout.h"

namespace loom::spec {

// Every broken rule, in field order; empty when the spec is valid.
std::vector<std::string> CheckJobSpec(const JobSpec& spec);

// OK, or INVALID_ARGUMENT whose message lists every broken rule ("; "-joined).
absl::Status ValidateJobSpec(const JobSpec& spec);

// What this engine runs, for a resolved layout (on top of CheckJobSpec): the
// one place its limits live. Submission checks the spec's layout
// (spec::LayoutOf), `parallelism: auto` searches only layouts that pass, and
// the trainer checks the layout of its parallel context. Every broken rule,
// each naming its field; empty when the engine runs the layout.
std::vector<std::string> CheckEngineRuns(const JobSpec& spec, const Layout& layout);
// OK, or INVALID_ARGUMENT listing every broken rule ("; "-joined).
absl::Status ValidateEngineRuns(const JobSpec& spec, const Layout& layout);

// Fills the parallel axes the user left out when only one layout is possible
// without the planner: every other axis defaults to 1 (zero_stage to 0) and dp
// takes the rest of the world size. Used where the planner is not consulted.
void FillTrivialLayout(JobSpec& spec);

}  // namespace loom::spec
