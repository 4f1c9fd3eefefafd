// planner_validate: prints how the planner's models agree with the measured
// runs, with the default (fitted) constants.
//   planner_validate [--data=DIR] [--cells] [--headroom=F] [--set=NAME=VALUE ...]
//                    [--vtrain_profile=megatron|nanotron]
// --set overrides one of nanotron's constants, for what-if checks. The
// playbook runs are scored with nanotron's profile; vTrain's with the
// Megatron profile built on it (or, for comparison, nanotron's own).
#include <cstdio>
#include <string>

#include "planner/constants.h"
#include "tools/planner/constant_table.h"
#include "tools/planner/evaluation.h"

int main(int argc, char** argv) {
  std::string dir = LOOM_MEASURED_RUNS_DIR;
  bool cells = false;
  double headroom = loom::planner::SearchSpace{}.memory_headroom;
  loom::planner::PlannerConstants k = loom::planner::NanotronConstants();
  std::string vtrain_profile = "megatron";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--data=", 0) == 0) {
      dir = arg.substr(7);
    } else if (arg.rfind("--headroom=", 0) == 0) {
      headroom = std::stod(arg.substr(11));
    } else if (arg.rfind("--set=", 0) == 0) {
      if (absl::Status s = loom::planner::eval::SetConstant(arg.substr(6), &k); !s.ok()) {
        std::fprintf(stderr, "planner_validate: %s\n", std::string(s.message()).c_str());
        return 2;
      }
    } else if (arg.rfind("--vtrain_profile=", 0) == 0) {
      vtrain_profile = arg.substr(17);
      if (vtrain_profile != "megatron" && vtrain_profile != "nanotron") {
        std::fprintf(stderr, "planner_validate: --vtrain_profile must be megatron or nanotron\n");
        return 2;
      }
    } else if (arg == "--cells") {
      cells = true;
    } else {
      std::fprintf(stderr, "usage: planner_validate [--data=DIR] [--cells] [--headroom=F] [--set=NAME=VALUE] [--vtrain_profile=megatron|nanotron]\n");
      return 2;
    }
  }
  auto runs = loom::planner::eval::LoadRuns(dir);
  if (!runs.ok()) {
    std::fprintf(stderr, "planner_validate: %s (measured runs are looked for in %s)\n",
                 std::string(runs.status().message()).c_str(), dir.c_str());
    return 1;
  }
  std::fputs(loom::planner::eval::FormatPlaybookReport(
                 loom::planner::eval::EvaluatePlaybook(runs->playbook, k, headroom), cells).c_str(), stdout);
  std::fputs(loom::planner::eval::FormatVtrainReport(
                 loom::planner::eval::EvaluateVtrain(
                 runs->vtrain, vtrain_profile == "megatron" ? loom::planner::MegatronConstants(k) : k))
                 .c_str(), stdout);
  return 0;
}
