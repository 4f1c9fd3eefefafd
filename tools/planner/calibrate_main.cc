// planner_calibrate: fits the planner's free constants on the Ultra-Scale
// Playbook runs (never on vTrain's, which stay held out) and prints them as
// the body of NanotronConstants().
//   planner_calibrate [--data=DIR] [--rounds=N] [--memory_error_weight=W] [--from_scratch]
//                     [--memory_regression] [--time_loss=trimmed|cell_centered]
//                     [--set=NAME=VALUE ...] [--fix=NAME ...]
// --memory_regression first fits the activation, working-set, logits and
// overhead constants by least squares on the measured peaks
// (tools/planner/memory_regression.h); the search then starts from there.
// --set starts NAME at VALUE; --fix keeps NAME out of the fit.
// Memory constants minimize wrong fit-or-not predictions (plus a small
// weight W, default 0.25, on the relative error of the peak of the runs that ran); time
// constants minimize the mean of the best 75% of |ln(predicted / measured tokens/s)| of the
// runs that ran (--time_loss=cell_centered: the same after subtracting each
// cell's median, so only the order inside a cell counts; tried, not the
// profile's fit: docs/planner.md). Both by coordinate search in log space from the current
// defaults, so a rerun from fitted values is a fixed point.
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/constants.h"
#include "tools/planner/constant_table.h"
#include "tools/planner/evaluation.h"
#include "tools/planner/memory_regression.h"

namespace lp = loom::planner;

namespace {

using Param = lp::eval::ConstantParam;

double CoordinateSearch(lp::PlannerConstants* k, const std::vector<Param>& params, int rounds,
                        const std::function<double(const lp::PlannerConstants&)>& loss) {
  double best = loss(*k);
  for (int round = 0; round < rounds; ++round) {
    const double step = std::pow(2.0, 1.0 - round * 0.5);  // multiplicative: x2, x1.41, x1, ...
    for (const Param& p : params) {
      for (int dir : {+1, -1}) {
        for (;;) {
          lp::PlannerConstants trial = *k;
          double& v = trial.*(p.field);
          const double factor = std::exp(dir * std::log1p(step));
          // A constant at zero (an overlap share) starts moving additively.
          v = v > 0 ? v * factor : (dir > 0 ? 0.05 * p.hi : 0.0);
          v = std::min(p.hi, std::max(p.lo, v));
          if (v == (*k).*(p.field)) break;
          const double l = loss(trial);
          if (l + 1e-12 >= best) break;
          best = l;
          *k = trial;
        }
      }
    }
    std::fprintf(stderr, "  round %d: loss %.5f\n", round, best);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = LOOM_MEASURED_RUNS_DIR;
  int rounds = 8;
  double memory_error_weight = 0.25;
  bool from_scratch = false;
  bool memory_regression = false;
  bool cell_centered = false;
  std::vector<std::string> sets, fixed;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--data=", 0) == 0) {
      dir = arg.substr(7);
    } else if (arg.rfind("--memory_error_weight=", 0) == 0) {
      memory_error_weight = std::stod(arg.substr(22));
    } else if (arg.rfind("--set=", 0) == 0) {
      sets.push_back(arg.substr(6));
    } else if (arg.rfind("--fix=", 0) == 0) {
      fixed.push_back(arg.substr(6));
    } else if (arg == "--from_scratch") {
      from_scratch = true;
    } else if (arg == "--time_loss=cell_centered") {
      cell_centered = true;
    } else if (arg == "--time_loss=trimmed") {
      cell_centered = false;
    } else if (arg == "--memory_regression") {
      memory_regression = true;
    } else if (arg.rfind("--rounds=", 0) == 0) {
      rounds = std::stoi(arg.substr(9));
    } else {
      std::fprintf(stderr, "usage: planner_calibrate [--data=DIR] [--rounds=N] [--memory_error_weight=W] [--from_scratch] [--memory_regression] [--time_loss=trimmed|cell_centered] [--set=NAME=VALUE] [--fix=NAME]\n");
      return 2;
    }
  }
  auto runs = lp::eval::LoadRuns(dir);
  if (!runs.ok()) {
    std::fprintf(stderr, "planner_calibrate: %s\n", std::string(runs.status().message()).c_str());
    return 1;
  }
  // From scratch: the struct's initial values, which are round physical
  // guesses; otherwise from the fitted defaults.
  lp::PlannerConstants k = from_scratch ? lp::PlannerConstants{} : lp::NanotronConstants();
  for (const std::string& set : sets) {
    if (absl::Status s = lp::eval::SetConstant(set, &k); !s.ok()) {
      std::fprintf(stderr, "planner_calibrate: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  auto free_params = [&](const std::vector<Param>& table) {
    std::vector<Param> out;
    for (const Param& p : table) {
      bool is_fixed = false;
      for (const std::string& f : fixed) is_fixed |= f == p.name;
      if (!is_fixed) out.push_back(p);
    }
    return out;
  };

  if (memory_regression) {
    auto fit = lp::eval::FitMemoryByRegression(runs->playbook, &k);
    if (!fit.ok()) {
      std::fprintf(stderr, "planner_calibrate: %s\n", std::string(fit.status().message()).c_str());
      return 1;
    }
    std::fprintf(stderr, "memory regression on %d peaks: mean |error| %.1f%% -> %.1f%%\n", fit->runs,
                 100 * fit->mean_abs_rel_error_before, 100 * fit->mean_abs_rel_error_after);
  }
  std::fprintf(stderr, "memory constants:\n");
  const std::vector<Param> memory = free_params(lp::eval::MemoryConstants());

  CoordinateSearch(&k, memory, rounds, [&](const lp::PlannerConstants& c) {
    const lp::eval::PlaybookReport r = lp::eval::EvaluatePlaybook(runs->playbook, c);
    return (1.0 - r.fit_accuracy) + memory_error_weight * r.memory_mean_abs_rel_error;
  });

  std::fprintf(stderr, "time constants:\n");
  const std::vector<Param> time = free_params(lp::eval::TimeConstants());

  CoordinateSearch(&k, time, rounds, [&](const lp::PlannerConstants& c) {
    const lp::eval::PlaybookReport r = lp::eval::EvaluatePlaybook(runs->playbook, c);
    return cell_centered ? r.throughput_cell_centered_abs_log_error
                         : r.throughput_trimmed_abs_log_error;
  });

  std::printf("  // Fitted by planner_calibrate on %zu playbook runs.\n", runs->playbook.size());
  for (const auto* list : {&lp::eval::MemoryConstants(), &lp::eval::TimeConstants()}) {
    for (const Param& p : *list) std::printf("  k.%s = %.6g;\n", p.name, k.*(p.field));
  }
  std::fputs(lp::eval::FormatPlaybookReport(lp::eval::EvaluatePlaybook(runs->playbook, k), false).c_str(),
             stdout);
  // vTrain stays held out: scored, never fitted, with the Megatron profile.
  std::fputs(lp::eval::FormatVtrainReport(
                 lp::eval::EvaluateVtrain(runs->vtrain, lp::MegatronConstants(k))).c_str(), stdout);
  return 0;
}
