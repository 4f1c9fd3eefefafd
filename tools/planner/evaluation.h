// How well the planner's models agree with the measured runs: the checks of
// docs/planner.md. Fit-or-not accuracy and throughput ranking on the
// playbook runs (the calibration set), iteration-time error on vTrain's
// Megatron runs (held out).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/constants.h"
#include "tools/planner/measured_runs.h"

namespace loom::planner::eval {

struct CellScore {
  std::string model;
  int64_t nodes = 0;
  int runs = 0;
  int succeeded = 0;
  double spearman = 0;        // predicted vs measured tokens/s over succeeded runs (n >= 3)
  bool scored = false;        // has a Spearman value
  bool picked_any = false;    // the planner predicted at least one run fits
  bool picked_ok = false;     // the run it picked succeeded
  double picked_mfu = 0;      // measured MFU (%) of the picked configuration (0 if it crashed)
  double best_mfu = 0;        // the cell's best measured MFU (%), repeated configurations averaged
  bool within_10pct = false;  // picked_mfu >= 0.9 * best_mfu
  // The same comparison on measured tokens/s per GPU, i.e. on MFU computed
  // with one FLOP count for every layout of the cell. The data's mfu_pct
  // counts a tied model's embedding twice when PP splits it from the LM head
  // (1B and 3B: MFU / tokens/s is 1.167x and 1.094x higher with pp > 1,
  // exactly the share of the second copy), which favours pipelined layouts.
  double picked_tok_s = 0;
  double best_tok_s = 0;
  bool within_10pct_tok_s = false;
};

struct PlaybookReport {
  int runs = 0;
  int correct_fit = 0;
  int predicted_fit_but_failed = 0;
  int predicted_oom_but_ran = 0;
  double fit_accuracy = 0;
  double mean_spearman = 0;     // over scored cells
  double median_spearman = 0;
  int scored_cells = 0;
  int cells_with_success = 0;
  int cells_within_10pct = 0;
  double pick_fraction = 0;     // cells_within_10pct / cells_with_success
  int cells_within_10pct_tok_s = 0;  // the same on tokens/s (CellScore)
  // The same two counts when the planner picks only among the configurations
  // that ran (have a measured MFU); crashes are scored by fit-or-not.
  int measured_only_within_10pct = 0;
  int measured_only_within_10pct_tok_s = 0;
  double memory_mean_abs_rel_error = 0;  // succeeded runs: |pred - mem_gb| / mem_gb
  double throughput_mean_abs_log_error = 0;  // succeeded runs: |ln(pred / measured)|
  double throughput_mean_abs_rel_error = 0;
  // The mean over the 75% of succeeded runs predicted best: robust to the
  // runs that were pathologically slow for reasons outside any layout model.
  double throughput_trimmed_abs_log_error = 0;
  // The same trimmed mean after subtracting each (model, nodes) cell's median
  // log error: only how runs compare inside a cell counts, which is all the
  // planner ranks on; a cell's common offset (that allocation's network, its
  // day) does not.
  double throughput_cell_centered_abs_log_error = 0;
  std::vector<CellScore> cells;
};

struct VtrainReport {
  int runs = 0;
  double mean_abs_rel_error = 0;  // |pred - measured| / measured, all runs
  double median_abs_rel_error = 0;
  double multi_mean_abs_rel_error = 0;
  double single_mean_abs_rel_error = 0;
  double mean_signed_rel_error = 0;  // > 0: the planner predicts too slow
  // Runs without tensor or pipeline parallelism (tp = pp = 1): compute, the
  // host's per-layer work and the DP reduction only, none of the TP/PP
  // communication costs that are the framework's.
  int no_model_parallel_runs = 0;
  double no_model_parallel_mean_abs_rel_error = 0;
  // By axis: runs with tp > 1 / tp = 1, and with pp > 1 / pp = 1.
  int tp_runs = 0, no_tp_runs = 0, pp_runs = 0, no_pp_runs = 0;
  double tp_mean_abs_rel_error = 0, no_tp_mean_abs_rel_error = 0;
  double pp_mean_abs_rel_error = 0, no_pp_mean_abs_rel_error = 0;
  double tp_mean_signed_rel_error = 0, pp_mean_signed_rel_error = 0;
};

// `headroom`: the share of device memory the planner prefers to leave free
// when it picks a layout (SearchSpace::memory_headroom: a tight configuration
// is picked only when none has headroom); fit-or-not uses all of it.
PlaybookReport EvaluatePlaybook(const std::vector<PlaybookRun>& runs,
                                const PlannerConstants& constants,
                                double headroom = SearchSpace{}.memory_headroom);
VtrainReport EvaluateVtrain(const std::vector<VtrainRun>& runs, const PlannerConstants& constants);

// Spearman rank correlation (average ranks for ties); 0 when undefined.
double Spearman(const std::vector<double>& a, const std::vector<double>& b);

std::string FormatPlaybookReport(const PlaybookReport& report, bool per_cell);
std::string FormatVtrainReport(const VtrainReport& report);

}  // namespace loom::planner::eval
