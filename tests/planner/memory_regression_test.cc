// The memory regression recovers known constants from peaks the model
// itself produced, and refuses what it cannot determine.
#include "tools/planner/memory_regression.h"

#include <vector>

#include "planner/memory_model.h"
#include "gtest/gtest.h"

namespace loom::planner::eval {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Runs over models, TP, PP and micro-batch sizes, each "measured" at the
// first stage's peak under `truth`.
std::vector<PlaybookRun> SyntheticRuns(const PlannerConstants& truth) {
  std::vector<PlaybookRun> runs;
  for (const char* model : {"1B", "8B"}) {
    for (int64_t tp : {1, 2, 4}) {
      for (int64_t pp : {1, 2}) {
        for (int64_t mbs : {1, 2, 4}) {
          PlaybookRun r;
          r.model = model;
          r.nodes = 1;
          r.tp = tp;
          r.pp = pp;
          r.dp = 8 / (tp * pp);
          r.mbs = mbs;
          r.gas = 4;
          r.zero = 1;
          r.ok = true;
          const MemoryBreakdown m = EstimateStageMemory(
              PlaybookWorkload(r), PlaybookLayout(r), PlaybookConstants(truth), kPlaybookMeasuredStage);
          r.mem_gb = m.total() / kGiB;
          runs.push_back(r);
        }
      }
    }
  }
  return runs;
}

TEST(MemoryRegression, RecoversTheConstantsThatMadeThePeaks) {
  PlannerConstants truth = NanotronConstants();
  truth.activation_factor = 1.3;
  truth.activation_working_sets = 2.0;
  truth.logits_bytes_per_element = 6.0;
  truth.memory_overhead_bytes = 0.5 * kGiB;
  const std::vector<PlaybookRun> runs = SyntheticRuns(truth);

  PlannerConstants fitted = NanotronConstants();  // starts elsewhere
  absl::StatusOr<MemoryRegression> fit = FitMemoryByRegression(runs, &fitted);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->runs, static_cast<int>(runs.size()));
  EXPECT_NEAR(fitted.activation_factor, 1.3, 1e-6);
  EXPECT_NEAR(fitted.activation_working_sets, 2.0, 1e-6);
  EXPECT_NEAR(fitted.logits_bytes_per_element, 6.0, 1e-6);
  EXPECT_NEAR(fitted.memory_overhead_bytes, 0.5 * kGiB, 1e3);
  EXPECT_EQ(fitted.backward_scratch_layers, 0.0);
  EXPECT_LT(fit->mean_abs_rel_error_after, 1e-9);
  EXPECT_GT(fit->mean_abs_rel_error_before, fit->mean_abs_rel_error_after);
}

TEST(MemoryRegression, CrashedRunsAreNotFitted) {
  std::vector<PlaybookRun> runs = SyntheticRuns(NanotronConstants());
  for (PlaybookRun& r : runs) r.ok = false;
  PlannerConstants k = NanotronConstants();
  absl::StatusOr<MemoryRegression> fit = FitMemoryByRegression(runs, &k);
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.status().message().find("0 runs"), absl::string_view::npos) << fit.status();
  EXPECT_EQ(k.activation_factor, NanotronConstants().activation_factor);  // kept
}

TEST(MemoryRegression, ANegativeCoefficientIsRefusedByName) {
  // Peaks far below what the counted terms alone need: the fit would want a
  // negative overhead.
  std::vector<PlaybookRun> runs = SyntheticRuns(NanotronConstants());
  for (PlaybookRun& r : runs) r.mem_gb *= 0.3;
  PlannerConstants k = NanotronConstants();
  absl::StatusOr<MemoryRegression> fit = FitMemoryByRegression(runs, &k);
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.status().message().find("must be >= 0"), absl::string_view::npos) << fit.status();
  EXPECT_EQ(k.memory_overhead_bytes, NanotronConstants().memory_overhead_bytes);
}

}  // namespace
}  // namespace loom::planner::eval
