// Reading and writing job specs as YAML. Parsing is strict: an unknown field,
// a value of the wrong type or an unknown enum name is an INVALID_ARGUMENT
// naming the field path. Range and cross-field rules live in job_spec_rules.h.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"

namespace loom::spec {

// source_name appears in errors (a file path, or "request").
absl::StatusOr<JobSpec> ParseJobSpecYaml(std::string_view yaml, std::string_view source_name);
absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path);

// Canonical YAML of a spec; ParseJobSpecYaml(ToYaml(s)) == s. Axes the planner
// has not chosen yet are left out, as the user wrote them.
std::string ToYaml(const JobSpec& spec);

}  // namespace loom::spec
