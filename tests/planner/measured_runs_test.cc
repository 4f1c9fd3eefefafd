// The planner against measured runs (tools/planner/data). Goals from the issue
// are asserted where the planner reaches them; where it does not, the value
// reached is asserted as a regression floor (docs/planner.md says which).
#include <filesystem>

#include "planner/constants.h"
#include "gtest/gtest.h"
#include "tools/planner/evaluation.h"
#include "tools/planner/memory_regression.h"
#include "tools/planner/measured_runs.h"

namespace loom::planner::eval {
namespace {

class MeasuredRunsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = LOOM_MEASURED_RUNS_DIR;
    absl::StatusOr<MeasuredRuns> r = LoadRuns(dir);
    if (!r.ok()) {
      error_ = new std::string(std::string(r.status().message()) +
                               " — the measured runs are committed under tools/planner/data; looked in " +
                               dir + " (LOOM_MEASURED_RUNS_DIR)");
      return;
    }
    runs_ = new MeasuredRuns(std::move(*r));
    // Each set with its framework's profile: nanotron's fitted constants for
    // the playbook, the Megatron profile (derived, not fitted) for vTrain.
    playbook_ = new PlaybookReport(EvaluatePlaybook(runs_->playbook, NanotronConstants()));
    vtrain_ = new VtrainReport(EvaluateVtrain(runs_->vtrain, MegatronConstants()));
  }
  void SetUp() override { ASSERT_EQ(error_, nullptr) << *error_; }

  static inline std::string* error_ = nullptr;
  static inline MeasuredRuns* runs_ = nullptr;
  static inline PlaybookReport* playbook_ = nullptr;
  static inline VtrainReport* vtrain_ = nullptr;
};

TEST_F(MeasuredRunsTest, DataIsWhatTheReadmeSays) {
  EXPECT_EQ(runs_->playbook.size(), 4710u);
  int ok = 0;
  for (const PlaybookRun& r : runs_->playbook) ok += r.ok;
  EXPECT_EQ(ok, 1758);
  EXPECT_EQ(runs_->vtrain.size(), 109u + 1440u);
}

// Goal: >= 90% of runs' fit-or-not predicted right. Reached.
TEST_F(MeasuredRunsTest, FitOrNotAccuracyGoal) {
  EXPECT_GE(playbook_->fit_accuracy, 0.90) << FormatPlaybookReport(*playbook_, false);
}

// nanotron's memory constants are the exact least-squares fit on the measured
// peaks: refitting from them gives them back (they are not edited by hand),
// and the fit beats the single-factor model it replaced (13.6% mean error
// against the first stage's peak).
TEST_F(MeasuredRunsTest, MemoryConstantsAreTheRegressionFit) {
  PlannerConstants refit = NanotronConstants();
  absl::StatusOr<MemoryRegression> fit = FitMemoryByRegression(runs_->playbook, &refit);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->runs, 1758);
  const PlannerConstants k = NanotronConstants();
  EXPECT_NEAR(refit.activation_factor, k.activation_factor, 1e-4 * k.activation_factor);
  EXPECT_NEAR(refit.activation_working_sets, k.activation_working_sets,
              1e-4 * k.activation_working_sets);
  EXPECT_NEAR(refit.logits_bytes_per_element, k.logits_bytes_per_element,
              1e-4 * k.logits_bytes_per_element);
  EXPECT_NEAR(refit.memory_overhead_bytes, k.memory_overhead_bytes, 1e-4 * k.memory_overhead_bytes);
  EXPECT_LE(playbook_->memory_mean_abs_rel_error, 0.12) << FormatPlaybookReport(*playbook_, false);
}

// No numeric goal: regression floor on the mean per-cell Spearman (0.697 reached).
TEST_F(MeasuredRunsTest, ThroughputRankCorrelationFloor) {
  EXPECT_EQ(playbook_->scored_cells, 26);
  EXPECT_GE(playbook_->mean_spearman, 0.69) << FormatPlaybookReport(*playbook_, true);
}

// Goal: picked layout within 10% of the cell's best in >= 80% of cells.
// NOT reached where a crashed configuration can be the pick (17 of 26 cells
// on the data's MFU column, 19 on measured tokens/s, which is MFU with one
// FLOP count per cell); picking only among the configurations that ran, 19
// and 21. Regression floors. docs/planner.md says why (repeat runs of one
// configuration differ by more than 10%; crashes that are not memory; the
// column counts a tied embedding twice under PP).
TEST_F(MeasuredRunsTest, PickedLayoutFloor) {
  EXPECT_EQ(playbook_->cells_with_success, 26);
  EXPECT_GE(playbook_->cells_within_10pct, 17) << FormatPlaybookReport(*playbook_, true);
  EXPECT_GE(playbook_->cells_within_10pct_tok_s, 19) << FormatPlaybookReport(*playbook_, true);
  EXPECT_GE(playbook_->measured_only_within_10pct, 19) << FormatPlaybookReport(*playbook_, true);
  EXPECT_GE(playbook_->measured_only_within_10pct_tok_s, 21) << FormatPlaybookReport(*playbook_, true);
  // A pick that ran is the pick among the configurations that ran too, so
  // leaving the crashed ones out can only add cells.
  EXPECT_GE(playbook_->measured_only_within_10pct, playbook_->cells_within_10pct);
  EXPECT_GE(playbook_->measured_only_within_10pct_tok_s, playbook_->cells_within_10pct_tok_s);
}

// Goal: held-out vTrain mean absolute error <= 15%. Reached with the
// Megatron profile (13.4%), whose link and framework constants come from
// NCCL's published measurements and vTrain's configs, not from vTrain's
// iteration times.
TEST_F(MeasuredRunsTest, VtrainHeldOutErrorGoal) {
  EXPECT_EQ(vtrain_->runs, 1549);
  EXPECT_LE(vtrain_->mean_abs_rel_error, 0.15) << FormatVtrainReport(*vtrain_);
}

// By axis: runs with TP are the worst part (15.4%); ceilings guard each
// split, the TP-free and PP-free ones at the goal.
TEST_F(MeasuredRunsTest, VtrainErrorByAxis) {
  EXPECT_EQ(vtrain_->no_model_parallel_runs, 243);
  EXPECT_LE(vtrain_->no_model_parallel_mean_abs_rel_error, 0.15) << FormatVtrainReport(*vtrain_);
  EXPECT_EQ(vtrain_->tp_runs + vtrain_->no_tp_runs, 1549);
  EXPECT_LE(vtrain_->tp_mean_abs_rel_error, 0.16) << FormatVtrainReport(*vtrain_);
  EXPECT_LE(vtrain_->no_tp_mean_abs_rel_error, 0.15) << FormatVtrainReport(*vtrain_);
  EXPECT_LE(vtrain_->pp_mean_abs_rel_error, 0.15) << FormatVtrainReport(*vtrain_);
  EXPECT_LE(vtrain_->no_pp_mean_abs_rel_error, 0.15) << FormatVtrainReport(*vtrain_);
}

// nanotron's own fitted communication costs do not describe Megatron: with
// them the runs with TP are predicted about twice too slow. This is why the
// profiles are separate (and a check that they stay so).
TEST_F(MeasuredRunsTest, NanotronProfileDoesNotTransferToMegatron) {
  const VtrainReport r = EvaluateVtrain(runs_->vtrain, NanotronConstants());
  EXPECT_GT(r.tp_mean_signed_rel_error, 0.5) << FormatVtrainReport(r);
}

TEST(ParseCsv, PlaybookRowsAndCrashes) {
  absl::StatusOr<std::vector<PlaybookRun>> runs = ParsePlaybookCsv(
      "model,nodes,dp,tp,pp,mbs,gas,zero,mfu_pct,tok_s_gpu,mem_gb\n"
      "1B,1,2,2,2,4,32,1,40.0,35063,27.7\n"
      "1B,1,1,8,1,256,1,0,nan,0,nan\n");
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_TRUE((*runs)[0].ok);
  EXPECT_EQ((*runs)[0].gas, 32);
  EXPECT_DOUBLE_EQ((*runs)[0].mem_gb, 27.7);
  EXPECT_FALSE((*runs)[1].ok);
  EXPECT_FALSE(ParsePlaybookCsv("model,nodes\n1B,1\n").ok());
}

TEST(ParseCsv, VtrainWithByteOrderMarkAndColumnsByName) {
  absl::StatusOr<std::vector<VtrainRun>> runs = ParseVtrainCsv(
      "\xEF\xBB\xBF# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
      "sequence length,tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\r\n"
      "8,32,4,1024,16,24,1024,2,2,2,219.732754\r\n",
      false);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].gpus, 8);
  EXPECT_EQ((*runs)[0].pp, 2);
  EXPECT_DOUBLE_EQ((*runs)[0].iteration_ms, 219.732754);
  EXPECT_EQ(VtrainLayout((*runs)[0]).grad_accum, 4);
}

TEST(Spearman, KnownValues) {
  EXPECT_DOUBLE_EQ(Spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(Spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  // d = (0, 0, 1, -1): 1 - 6*2/(4*15) = 0.8.
  EXPECT_NEAR(Spearman({1, 2, 3, 4}, {1, 2, 4, 3}), 0.8, 1e-12);
}

}  // namespace
}  // namespace loom::planner::eval
