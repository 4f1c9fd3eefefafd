// Fits the framework-specific memory constants of a profile by weighted
// least squares on the measured peaks of the runs that ran: the peak less
// what the model counts exactly (weights, gradients, optimizer states,
// buffers) is explained as
//   activation_factor · (stored activations)
//   + activation_factor · activation_working_sets · (one layer's working set)
//   + logits_bytes_per_element · (logit elements) + memory_overhead_bytes,
// each run weighted by 1 / its peak (relative error). Linear in the four
// coefficients, so the fit is exact, not a search. The peak compared is the
// first pipeline stage's, where the playbook measured it (measured_runs.h).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "planner/constants.h"
#include "tools/planner/measured_runs.h"

namespace loom::planner::eval {

struct MemoryRegression {
  int runs = 0;  // succeeded runs with a measured peak
  double mean_abs_rel_error_before = 0;
  double mean_abs_rel_error_after = 0;
};

// Replaces the four constants in *constants with the fit. Refuses (and
// leaves them) when a coefficient comes out negative or the system is
// singular.
absl::StatusOr<MemoryRegression> FitMemoryByRegression(const std::vector<PlaybookRun>& runs,
                                                      PlannerConstants* constants);

}  // namespace loom::planner::eval
