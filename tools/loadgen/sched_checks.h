// The rules a scheduling run (sched_run.h) must follow, checked after it from
// what the coordinator recorded (each job's history: submitted, STARTING,
// ended, on the coordinator's clock) and what the fake nodes saw (each
// device's launches and exits), and what it measured. Pure.
//
// The rules (docs/scale.md, "Scheduling a shared cluster at scale"):
//  1. Every job succeeds, in one attempt.
//  2. Capacity and quotas: at no start do the jobs holding devices (STARTING
//     until they ended, as the coordinator counts them) exceed the cluster,
//     or a user's jobs the user's quota. The nodes' own view (launch to exit,
//     which lies inside the coordinator's) never gives a device to two jobs
//     or a user more than the quota either.
//  3. Priority order among startable jobs: when a job starts, no job of
//     higher priority that was waiting then (submitted, not started) could
//     have started instead: it would have fitted in the free devices and its
//     owner's quota even counting every job that held devices within
//     `tolerance_s` of that start (so that the moments of a pass, and the
//     milliseconds of the history, cannot make a false alarm).
//  4. The fair-share bound: no job waits longer than the cluster takes to run,
//     at half its devices, all work (devices x seconds) of its priority or
//     higher submitted before it started, plus its owner's own such work at
//     the owner's quota, plus two of the longest jobs (a reservation waits
//     for one to end, a backfilled one may run) and `slack_s` of launch
//     latency. Fair share may put a job behind other users' later jobs of its
//     priority, but only behind work that exists; a starved job exceeds it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom::loadgen {

// One job as the run saw it end; times in seconds on one clock.
struct SchedJobOutcome {
  std::string id;
  std::string user;
  int64_t priority = 0;
  int64_t devices = 0;
  double submit_s = 0;
  double start_s = -1;  // STARTING; < 0: never started
  double end_s = -1;    // ended (stopped holding devices); < 0: never
  bool succeeded = false;
  int32_t attempts = 0;
};

// A fake node's launch or exit of one rank.
struct DeviceEvent {
  double time_s = 0;
  std::string node;
  int32_t device = 0;
  std::string job_id;
  bool launch = false;  // else an exit
};

struct SchedCheckInput {
  int64_t capacity = 0;  // GPUs
  std::map<std::string, int64_t> gpu_quota;
  std::vector<SchedJobOutcome> jobs;
  std::vector<DeviceEvent> events;
  double tolerance_s = 1.0;
  double slack_s = 5;
};

struct Percentiles {
  int64_t count = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
};

struct SchedCheckResult {
  std::vector<std::string> violations;  // one line each; empty: every rule held
  // Measured.
  double makespan_s = 0;       // first submission to last end
  double utilization = 0;      // device-seconds run / (capacity x makespan)
  double first_wave_rate = 0;  // starts per second before the first job ended
  int64_t first_wave_starts = 0;
  Percentiles device_idle_s;     // a device's exit to its next launch, while jobs waited
  Percentiles reaction_s;        // a job's end to the next start anywhere, while jobs waited
  Percentiles wait_s;            // submission to start
  double worst_bound_ratio = 0;  // the largest wait / fair-share bound
  std::map<int64_t, double> mean_wait_by_priority;
};

SchedCheckResult CheckSchedulingRun(const SchedCheckInput& input);

}  // namespace loom::loadgen
