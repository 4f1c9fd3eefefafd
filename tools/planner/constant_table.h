// The planner's fitted constants by name, with the physical bounds the
// calibration keeps them in: what planner_calibrate fits and what
// `--set=NAME=VALUE` on the tools overrides for what-if checks.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "planner/constants.h"

namespace loom::planner::eval {

struct ConstantParam {
  const char* name;
  double PlannerConstants::*field;
  double lo, hi;  // the fit stays within [lo, hi]
};

// Fitted against fit-or-not accuracy and the memory peak.
const std::vector<ConstantParam>& MemoryConstants();
// Fitted against measured throughput.
const std::vector<ConstantParam>& TimeConstants();

// Applies "NAME=VALUE" to `k`; the error names the constant or the value at
// fault and lists the known names.
absl::Status SetConstant(absl::string_view assignment, PlannerConstants* k);

}  // namespace loom::planner::eval
