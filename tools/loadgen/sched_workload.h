// The jobs of loom-loadgen's scheduling run (sched_run.h): mixed sizes and
// priorities from several users, each running a short fake time, two users
// under quotas, the mix of tests/coordinator/scheduling_simulation.h scaled
// to the cluster. Pure.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom::loadgen {

struct SchedWorkloadOptions {
  int64_t devices = 256 * 8;  // the cluster's GPUs
  int jobs = 1000;
  int users = 10;
  uint32_t seed = 7;
  int64_t min_steps = 10;  // each job runs steps x the fake step time
  int64_t max_steps = 40;
  double step_s = 0.1;
};

struct SchedJobPlan {
  std::string name;  // sched-<index>
  std::string user;  // user-<i>
  int64_t priority = 0;
  int64_t devices = 0;  // dp ranks, tp 1: any free devices hold it
  int64_t steps = 0;
  double max_runtime_s = 0;  // promised (a fifth promise nothing)
};

struct SchedWorkload {
  std::vector<SchedJobPlan> jobs;            // in submission order
  std::map<std::string, int64_t> gpu_quota;  // by user; others: none
};

// Sizes 1..256 GPUs (at most a quarter of the cluster), priorities 0, 1 and 5;
// user-0 may hold a quarter of the cluster, user-1 an eighth, and none of
// their jobs is larger than their quota (it could never start).
SchedWorkload MakeSchedWorkload(const SchedWorkloadOptions& options);

// The job's spec: dp = devices on gpu nodes of 8, tp 1, no restarts, no hang
// detection (its fake ranks report nothing), scheduling.priority and
// max_runtime_s.
std::string SchedJobSpec(const SchedJobPlan& job);

}  // namespace loom::loadgen
