#include "tools/planner/memory_regression.h"

#include <array>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"
#include "planner/memory_model.h"
#include "tools/planner/evaluation.h"

namespace loom::planner::eval {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int kTerms = 4;  // stored activations, one working set, logit elements, constant
using Row = std::array<double, kTerms>;

struct Sample {
  Row x;
  double explained_bytes;  // measured peak less what is counted exactly
  double weight;           // 1 / measured peak: relative error
};

// One run's features: the memory of its first pipeline stage (where the
// playbook's peak was measured, measured_runs.h) with the fitted terms
// switched off, then each switched on at unit size.
Sample Features(const PlaybookRun& run, const PlannerConstants& k) {
  const Workload w = PlaybookWorkload(run);
  const Layout l = PlaybookLayout(run);
  const int64_t stage = kPlaybookMeasuredStage;
  PlannerConstants unit = k;
  unit.activation_factor = 1.0;
  unit.activation_working_sets = 0.0;
  unit.backward_scratch_layers = 0.0;
  unit.logits_bytes_per_element = 0.0;
  unit.memory_overhead_bytes = 0.0;
  const MemoryBreakdown base = EstimateStageMemory(w, l, unit, stage);
  PlannerConstants one_set = unit;
  one_set.activation_working_sets = 1.0;
  PlannerConstants logit_elements = unit;
  logit_elements.logits_bytes_per_element = 1.0;
  Sample s;
  s.x = {base.activations, EstimateStageMemory(w, l, one_set, stage).activations - base.activations,
         EstimateStageMemory(w, l, logit_elements, stage).logits, 1.0};
  const double measured = run.mem_gb * kGiB;
  s.explained_bytes = measured - (base.total() - base.activations);
  s.weight = 1.0 / measured;
  return s;
}

// Solves the normal equations A·c = b by Gaussian elimination with partial
// pivoting; false when A is singular.
bool Solve(std::array<Row, kTerms> a, Row b, Row* c) {
  for (int col = 0; col < kTerms; ++col) {
    int pivot = col;
    for (int r = col + 1; r < kTerms; ++r) {
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    }
    if (std::abs(a[pivot][col]) < 1e-300) return false;
    std::swap(a[col], a[pivot]);
    std::swap(b[col], b[pivot]);
    for (int r = col + 1; r < kTerms; ++r) {
      const double f = a[r][col] / a[col][col];
      for (int j = col; j < kTerms; ++j) a[r][j] -= f * a[col][j];
      b[r] -= f * b[col];
    }
  }
  for (int r = kTerms - 1; r >= 0; --r) {
    double v = b[r];
    for (int j = r + 1; j < kTerms; ++j) v -= a[r][j] * (*c)[j];
    (*c)[r] = v / a[r][r];
  }
  return true;
}

}  // namespace

absl::StatusOr<MemoryRegression> FitMemoryByRegression(const std::vector<PlaybookRun>& runs,
                                                      PlannerConstants* constants) {
  const PlannerConstants k = PlaybookConstants(*constants);
  std::array<Row, kTerms> normal{};
  Row rhs{};
  MemoryRegression out;
  for (const PlaybookRun& run : runs) {
    if (!run.ok || !(run.mem_gb > 0)) continue;
    const Sample s = Features(run, k);
    const double w2 = s.weight * s.weight;
    for (int i = 0; i < kTerms; ++i) {
      for (int j = 0; j < kTerms; ++j) normal[i][j] += w2 * s.x[i] * s.x[j];
      rhs[i] += w2 * s.x[i] * s.explained_bytes;
    }
    ++out.runs;
  }
  Row c{};
  if (out.runs < kTerms || !Solve(normal, rhs, &c)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("memory regression: %d runs with a measured peak do not determine the "
                        "%d coefficients",
                        out.runs, kTerms));
  }
  static constexpr const char* kNames[kTerms] = {"activation_factor", "working-set bytes",
                                                  "logits_bytes_per_element",
                                                  "memory_overhead_bytes"};
  for (int i = 0; i < kTerms; ++i) {
    if (!(c[i] >= 0)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "memory regression: %s came out %g (must be >= 0); constants kept", kNames[i], c[i]));
    }
  }
  out.mean_abs_rel_error_before = EvaluatePlaybook(runs, *constants).memory_mean_abs_rel_error;
  constants->activation_factor = c[0];
  constants->activation_working_sets = c[0] > 0 ? c[1] / c[0] : 0.0;  // the factor scales the sets too
  constants->backward_scratch_layers = 0.0;  // a working set already covers one layer's scratch
  constants->logits_bytes_per_element = c[2];
  constants->memory_overhead_bytes = c[3];
  out.mean_abs_rel_error_after = EvaluatePlaybook(runs, *constants).memory_mean_abs_rel_error;
  return out;
}

}  // namespace loom::planner::eval
