// The agreement metrics between planner and measurements.
#include "tools/planner/evaluation.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::planner::eval {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::vector<double> Ranks(const std::vector<double>& v) {
  std::vector<size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    const double avg = (static_cast<double>(i) + static_cast<double>(j)) / 2.0 + 1.0;
    for (size_t k = i; k <= j; ++k) r[idx[k]] = avg;
    i = j + 1;
  }
  return r;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

double Spearman(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.size() < 2) return 0;
  const std::vector<double> ra = Ranks(a), rb = Ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n;
  const double mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    cov += (ra[i] - ma) * (rb[i] - mb);
    va += (ra[i] - ma) * (ra[i] - ma);
    vb += (rb[i] - mb) * (rb[i] - mb);
  }
  if (va == 0 || vb == 0) return 0;
  return cov / std::sqrt(va * vb);
}

PlaybookReport EvaluatePlaybook(const std::vector<PlaybookRun>& runs,
                                const PlannerConstants& constants, double headroom) {
  const PlannerConstants k = PlaybookConstants(constants);
  PlaybookReport rep;
  struct Scored {
    const PlaybookRun* run;
    bool fits;
    bool pickable;  // fits with the headroom the planner prefers
    double tok_s_gpu;
  };
  std::map<std::pair<int, int64_t>, std::vector<Scored>> cells;
  std::map<std::string, int> model_order = {{"1B", 0}, {"3B", 1}, {"8B", 2}, {"80B", 3}};
  double mem_err = 0, log_err = 0, rel_err = 0;
  std::vector<double> log_errors;
  int succeeded = 0;
  for (const PlaybookRun& run : runs) {
    const Workload w = PlaybookWorkload(run);
    const Layout l = PlaybookLayout(run);
    const ClusterSpec c = PlaybookCluster(run);
    const MemoryBreakdown mem = EstimateMemory(w, l, k);
    // A layout the planner's rules reject (more stages than layers) counts as
    // predicted to fail, like one that runs out of memory.
    const bool fits = mem.total() <= c.memory_bytes && PlaybookLayoutValid(run);
    const StepTime t = EstimateStepTime(w, l, c, k);
    ++rep.runs;
    if (fits == run.ok) ++rep.correct_fit;
    if (fits && !run.ok) ++rep.predicted_fit_but_failed;
    if (!fits && run.ok) ++rep.predicted_oom_but_ran;
    if (run.ok) {
      ++succeeded;
      const double measured_stage = mem.stage == kPlaybookMeasuredStage
                                        ? mem.total()
                                        : EstimateStageMemory(w, l, k, kPlaybookMeasuredStage).total();
      mem_err += std::abs(measured_stage / kGiB - run.mem_gb) / run.mem_gb;
      const double le = std::abs(std::log(t.tokens_per_second_per_device / run.tok_s_gpu));
      log_err += le;
      log_errors.push_back(le);
      rel_err += std::abs(t.tokens_per_second_per_device - run.tok_s_gpu) / run.tok_s_gpu;
    }
    const int order = model_order.count(run.model) ? model_order[run.model] : 9;
    const bool pickable = fits && mem.total() <= (1.0 - headroom) * c.memory_bytes;
    cells[{order, run.nodes}].push_back({&run, fits, pickable, t.tokens_per_second_per_device});
  }
  rep.fit_accuracy = rep.runs ? static_cast<double>(rep.correct_fit) / rep.runs : 0;
  if (succeeded > 0) {
    rep.memory_mean_abs_rel_error = mem_err / succeeded;
    rep.throughput_mean_abs_log_error = log_err / succeeded;
    rep.throughput_mean_abs_rel_error = rel_err / succeeded;
    std::sort(log_errors.begin(), log_errors.end());
    const size_t keep = std::max<size_t>(1, log_errors.size() * 3 / 4);
    rep.throughput_trimmed_abs_log_error =
        std::accumulate(log_errors.begin(), log_errors.begin() + keep, 0.0) / keep;
  }

  std::vector<double> centered;
  for (const auto& [unused, list] : cells) {
    std::vector<double> residuals;
    for (const Scored& s : list) {
      if (s.run->ok) residuals.push_back(std::log(s.tok_s_gpu / s.run->tok_s_gpu));
    }
    if (residuals.empty()) continue;
    const double median = Median(residuals);
    for (double r : residuals) centered.push_back(std::abs(r - median));
  }
  if (!centered.empty()) {
    std::sort(centered.begin(), centered.end());
    const size_t keep = std::max<size_t>(1, centered.size() * 3 / 4);
    rep.throughput_cell_centered_abs_log_error =
        std::accumulate(centered.begin(), centered.begin() + keep, 0.0) / keep;
  }

  std::vector<double> spearmans;
  for (auto& [key, list] : cells) {
    CellScore cs;
    cs.model = list.front().run->model;
    cs.nodes = key.second;
    cs.runs = static_cast<int>(list.size());
    std::vector<double> pred, meas;
    // A configuration that ran more than once counts once: it succeeded if
    // any run did (a crash beside a success was not the layout's fault), at
    // the mean MFU of its successes.
    struct Config {
      const Scored* first = nullptr;
      int ok_runs = 0;
      double mfu_sum = 0;
      double tok_s_sum = 0;
    };
    std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>, Config> configs;
    for (const Scored& s : list) {
      if (s.run->ok) {
        ++cs.succeeded;
        pred.push_back(s.tok_s_gpu);
        meas.push_back(s.run->tok_s_gpu);
      }
      const PlaybookRun& r = *s.run;
      Config& cfg = configs[{r.dp, r.tp, r.pp, r.mbs, r.gas, r.zero}];
      if (cfg.first == nullptr) cfg.first = &s;
      if (r.ok) {
        ++cfg.ok_runs;
        cfg.mfu_sum += r.mfu_pct;
        cfg.tok_s_sum += r.tok_s_gpu;
      }
    }
    // As the search ranks: configurations with headroom first, then the
    // tight ones, fastest first within each.
    const Config* pick = nullptr;
    const Config* pick_measured = nullptr;  // among the configurations that ran
    auto ahead = [](const Config& a, const Config& b) {
      if (a.first->pickable != b.first->pickable) return a.first->pickable;
      return a.first->tok_s_gpu > b.first->tok_s_gpu;
    };
    for (const auto& [unused, cfg] : configs) {
      if (cfg.ok_runs > 0) {
        cs.best_mfu = std::max(cs.best_mfu, cfg.mfu_sum / cfg.ok_runs);
        cs.best_tok_s = std::max(cs.best_tok_s, cfg.tok_s_sum / cfg.ok_runs);
      }
      if (cfg.first->fits && (pick == nullptr || ahead(cfg, *pick))) pick = &cfg;
      if (cfg.first->fits && cfg.ok_runs > 0 && (pick_measured == nullptr || ahead(cfg, *pick_measured))) {
        pick_measured = &cfg;
      }
    }
    if (pred.size() >= 3) {
      cs.scored = true;
      cs.spearman = Spearman(pred, meas);
      spearmans.push_back(cs.spearman);
    }
    if (pick != nullptr) {
      cs.picked_any = true;
      cs.picked_ok = pick->ok_runs > 0;
      cs.picked_mfu = pick->ok_runs > 0 ? pick->mfu_sum / pick->ok_runs : 0;
      cs.picked_tok_s = pick->ok_runs > 0 ? pick->tok_s_sum / pick->ok_runs : 0;
    }
    if (cs.succeeded > 0) {
      ++rep.cells_with_success;
      cs.within_10pct = cs.picked_ok && cs.picked_mfu >= 0.9 * cs.best_mfu;
      if (cs.within_10pct) ++rep.cells_within_10pct;
      cs.within_10pct_tok_s = cs.picked_ok && cs.picked_tok_s >= 0.9 * cs.best_tok_s;
      if (cs.within_10pct_tok_s) ++rep.cells_within_10pct_tok_s;
      if (pick_measured != nullptr) {
        const double n = pick_measured->ok_runs;
        if (pick_measured->mfu_sum / n >= 0.9 * cs.best_mfu) ++rep.measured_only_within_10pct;
        if (pick_measured->tok_s_sum / n >= 0.9 * cs.best_tok_s) ++rep.measured_only_within_10pct_tok_s;
      }
    }
    rep.cells.push_back(cs);
  }
  rep.scored_cells = static_cast<int>(spearmans.size());
  if (!spearmans.empty()) {
    rep.mean_spearman = std::accumulate(spearmans.begin(), spearmans.end(), 0.0) / spearmans.size();
    rep.median_spearman = Median(spearmans);
  }
  rep.pick_fraction =
      rep.cells_with_success ? static_cast<double>(rep.cells_within_10pct) / rep.cells_with_success : 0;
  return rep;
}

VtrainReport EvaluateVtrain(const std::vector<VtrainRun>& runs, const PlannerConstants& k) {
  VtrainReport rep;
  std::vector<double> errors;
  double multi = 0, single = 0, signed_err = 0;
  int n_multi = 0, n_single = 0;
  for (const VtrainRun& run : runs) {
    const StepTime t = EstimateStepTime(VtrainWorkload(run), VtrainLayout(run), VtrainCluster(run), k);
    const double measured = run.iteration_ms / 1e3;
    const double signed_one = (t.total - measured) / measured;
    const double err = std::abs(signed_one);
    signed_err += signed_one;
    errors.push_back(err);
    (run.multi ? multi : single) += err;
    if (run.tp > 1) {
      ++rep.tp_runs;
      rep.tp_mean_abs_rel_error += err;
      rep.tp_mean_signed_rel_error += signed_one;
    } else {
      ++rep.no_tp_runs;
      rep.no_tp_mean_abs_rel_error += err;
    }
    if (run.pp > 1) {
      ++rep.pp_runs;
      rep.pp_mean_abs_rel_error += err;
      rep.pp_mean_signed_rel_error += signed_one;
    } else {
      ++rep.no_pp_runs;
      rep.no_pp_mean_abs_rel_error += err;
    }
    if (run.tp == 1 && run.pp == 1) {
      ++rep.no_model_parallel_runs;
      rep.no_model_parallel_mean_abs_rel_error += err;
    }
    ++(run.multi ? n_multi : n_single);
  }
  rep.runs = static_cast<int>(runs.size());
  if (rep.runs > 0) {
    rep.mean_abs_rel_error = std::accumulate(errors.begin(), errors.end(), 0.0) / rep.runs;
    rep.median_abs_rel_error = Median(errors);
    rep.mean_signed_rel_error = signed_err / rep.runs;
  }
  if (n_multi) rep.multi_mean_abs_rel_error = multi / n_multi;
  if (n_single) rep.single_mean_abs_rel_error = single / n_single;
  if (rep.no_model_parallel_runs) {
    rep.no_model_parallel_mean_abs_rel_error /= rep.no_model_parallel_runs;
  }
  auto mean = [](double* sum, int n) { *sum = n ? *sum / n : 0; };
  mean(&rep.tp_mean_abs_rel_error, rep.tp_runs);
  mean(&rep.tp_mean_signed_rel_error, rep.tp_runs);
  mean(&rep.no_tp_mean_abs_rel_error, rep.no_tp_runs);
  mean(&rep.pp_mean_abs_rel_error, rep.pp_runs);
  mean(&rep.pp_mean_signed_rel_error, rep.pp_runs);
  mean(&rep.no_pp_mean_abs_rel_error, rep.no_pp_runs);
  return rep;
}

std::string FormatPlaybookReport(const PlaybookReport& r, bool per_cell) {
  std::string out = absl::StrFormat(
      "playbook: %d runs\n"
      "  fit-or-not predicted right: %d (%.1f%%); predicted to fit but failed %d, predicted OOM but ran %d\n"
      "  throughput rank correlation per cell (Spearman, %d cells with >= 3 runs): mean %.3f, median %.3f\n"
      "  picked layout within 10%% of the cell's best measured MFU: %d of %d cells (%.1f%%); "
      "on measured tokens/s (MFU with one FLOP count): %d of %d\n"
      "  picked among the configurations that ran: %d of %d on MFU, %d of %d on tokens/s\n"
      "  succeeded runs: memory |error| %.1f%% of measured, tokens/s |error| %.1f%% (|log| %.3f, "
      "best 75%%: %.3f; centered on each cell: %.3f)\n",
      r.runs, r.correct_fit, 100 * r.fit_accuracy, r.predicted_fit_but_failed,
      r.predicted_oom_but_ran, r.scored_cells, r.mean_spearman, r.median_spearman,
      r.cells_within_10pct, r.cells_with_success, 100 * r.pick_fraction,
      r.cells_within_10pct_tok_s, r.cells_with_success, r.measured_only_within_10pct,
      r.cells_with_success, r.measured_only_within_10pct_tok_s, r.cells_with_success,
      100 * r.memory_mean_abs_rel_error, 100 * r.throughput_mean_abs_rel_error,
      r.throughput_mean_abs_log_error, r.throughput_trimmed_abs_log_error,
      r.throughput_cell_centered_abs_log_error);
  if (per_cell) {
    absl::StrAppend(&out, absl::StrFormat("  %-5s %5s %5s %5s %9s %10s %9s %10s %12s %10s %s\n",
                                          "model", "nodes", "runs", "ok", "spearman", "picked MFU",
                                          "best MFU", "within 10%", "picked tok/s", "best tok/s",
                                          "within 10%"));
    for (const CellScore& c : r.cells) {
      absl::StrAppend(&out, absl::StrFormat(
          "  %-5s %5d %5d %5d %9s %10s %9.1f %10s %12s %10.0f %s\n", c.model, c.nodes, c.runs,
          c.succeeded, c.scored ? absl::StrFormat("%.3f", c.spearman) : "-",
          c.picked_any ? absl::StrFormat("%.1f", c.picked_mfu) : "none", c.best_mfu,
          c.succeeded == 0 ? "-" : (c.within_10pct ? "yes" : "no"),
          c.picked_any ? absl::StrFormat("%.0f", c.picked_tok_s) : "none", c.best_tok_s,
          c.succeeded == 0 ? "-" : (c.within_10pct_tok_s ? "yes" : "no")));
    }
  }
  return out;
}

std::string FormatVtrainReport(const VtrainReport& r) {
  return absl::StrFormat(
      "vtrain (held out): %d runs, iteration time mean |error| %.1f%% (median %.1f%%; multi-node "
      "%.1f%%, single-node %.1f%%), mean signed error %+.1f%%\n"
      "  without TP or PP (%d runs): mean |error| %.1f%%\n"
      "  with TP (%d runs): %.1f%% (signed %+.1f%%); without TP (%d): %.1f%%\n"
      "  with PP (%d runs): %.1f%% (signed %+.1f%%); without PP (%d): %.1f%%\n",
      r.runs, 100 * r.mean_abs_rel_error, 100 * r.median_abs_rel_error,
      100 * r.multi_mean_abs_rel_error, 100 * r.single_mean_abs_rel_error,
      100 * r.mean_signed_rel_error, r.no_model_parallel_runs,
      100 * r.no_model_parallel_mean_abs_rel_error, r.tp_runs, 100 * r.tp_mean_abs_rel_error,
      100 * r.tp_mean_signed_rel_error, r.no_tp_runs, 100 * r.no_tp_mean_abs_rel_error, r.pp_runs,
      100 * r.pp_mean_abs_rel_error, 100 * r.pp_mean_signed_rel_error, r.no_pp_runs,
      100 * r.no_pp_mean_abs_rel_error);
}

}  // namespace loom::planner::eval
