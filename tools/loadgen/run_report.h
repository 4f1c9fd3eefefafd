// What a loom-loadgen run measured, printed: the lines a person reads and
// the one `RESULT key=value ...` line scripts parse (tests/bench/scale).
#pragma once

#include "tools/loadgen/cluster_stats.h"
#include "tools/loadgen/coordinator_probe.h"
#include "tools/loadgen/fault_run.h"

namespace loom::loadgen {

struct RunSummary {
  int ranks = 0;
  int nodes = 0;
  int gpus = 0;
  double to_running_s = -1;  // submit -> RUNNING (-1: never)
  double launch_cpu_s = -1;  // the coordinator's CPU seconds in that time (-1: unknown)
  // The steady window: reports and batches delivered per second, loadgen's
  // own CPU and, with --coordinator_pid, the coordinator's.
  double reports_per_s = 0;
  double batches_per_s = 0;
  double loadgen_cpu_fraction = 0;
  bool coordinator_measured = false;
  double cpu_fraction = 0;
  double cpu_per_report_us = 0;
  double run_delay_fraction = 0;
  int lost_nodes = 0;
  int lost_events = 0;
  // --stop_rank's hang.
  int stop_rank = -1;
  double hang_after_s = -1;
  double hang_timeout_s = 0;
  int named = -1;
  // --fail_rank's recovery (null: none).
  const FaultPlan* fault = nullptr;
  const FaultOutcome* recovery = nullptr;
  bool correct = false;
};

void PrintRunReport(const RunSummary& run, CoordinatorProbe& probe, const ClusterStats& stats);

}  // namespace loom::loadgen
