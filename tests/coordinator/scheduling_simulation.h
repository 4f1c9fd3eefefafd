// A discrete-event run of the scheduling policy (scheduling_policy.h) over a
// made-up shared cluster: jobs of mixed sizes and priorities from several
// users arrive, start when the policy says so, and end after their actual
// runtime (at most what they promised). Pure; used by the rule checks at
// scale (scheduling_simulation_test.cc) and the benchmark
// (tests/bench/scheduling). Counts only devices: the placement on nodes is
// topology's (tests/topology).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/fair_share.h"
#include "coordinator/jobs/scheduling_policy.h"

namespace loom::coordinator::sched::testing {

struct SimJob {
  WaitingJob spec;
  double submit_s = 0;
  double actual_s = 0;  // how long it really runs (<= spec.runtime_s when promised)
  double start_s = -1;
  double end_s = -1;
  Action how = Action::kWait;  // how it started
  bool done = false;
};

struct SimConfig {
  int64_t devices = 256 * 8;  // 256 nodes of 8 GPUs
  int jobs = 1000;
  int users = 10;
  uint32_t seed = 7;
  std::map<std::string, int64_t> user_quota;  // gpu, by user
  PolicyOptions policy;
  double half_life_s = 3600;
};

// What went wrong, one line each (empty: every rule held), and what it took.
struct SimResult {
  std::vector<std::string> violations;
  std::vector<SimJob> jobs;
  int64_t decide_calls = 0;
  int64_t decisions = 0;  // jobs decided over all calls
  double max_wait_s = 0;
  double end_s = 0;
};

inline std::vector<SimJob> MakeJobs(const SimConfig& config) {
  std::mt19937 rng(config.seed);
  const int64_t sizes[] = {1, 2, 4, 8, 8, 16, 32, 64, 128, 256};
  const int64_t priorities[] = {0, 0, 0, 0, 1, 1, 5};
  std::vector<SimJob> jobs;
  for (int i = 0; i < config.jobs; ++i) {
    SimJob j;
    j.spec.id = absl::StrCat("job-", i);
    j.spec.user = absl::StrCat("user-", i % config.users);
    j.spec.priority = priorities[rng() % 7];
    j.spec.kind = "gpu";
    j.spec.devices = sizes[rng() % 10];
    j.spec.order = i;
    const double promised = 300 + static_cast<double>(rng() % 3300);
    // A fifth promise nothing (they never backfill, and reservations behind
    // them are unknown); the rest end within what they promised.
    j.spec.runtime_s = (rng() % 5 == 0) ? 0 : promised;
    j.actual_s = promised * (0.5 + 0.5 * static_cast<double>(rng() % 1000) / 1000.0);
    j.submit_s = static_cast<double>(i) * 3.6;  // all within the first hour
    jobs.push_back(j);
  }
  return jobs;
}

inline SimResult Simulate(const SimConfig& config) {
  SimResult result;
  result.jobs = MakeJobs(config);
  std::vector<SimJob>& jobs = result.jobs;
  FairShareLedger ledger(config.half_life_s);
  Quotas quotas;
  for (const auto& [user, q] : config.user_quota) quotas.users[{user, "gpu"}] = q;
  double now = 0;
  double charged = 0;
  size_t finished = 0;
  while (finished < jobs.size()) {
    // Next event: a submission or an end.
    double next = 1e300;
    for (const SimJob& j : jobs) {
      if (j.submit_s > now) next = std::min(next, j.submit_s);
      if (j.start_s >= 0 && j.end_s > now) next = std::min(next, j.end_s);
    }
    if (next == 1e300) {
      result.violations.push_back(absl::StrCat("stuck at t=", now, " with ", jobs.size() - finished,
                                                " jobs unfinished"));
      break;
    }
    now = next;
    ClusterView view;
    view.now_s = now;
    view.capacity["gpu"] = config.devices;
    int64_t held = 0;
    std::map<std::string, int64_t> held_by_user;
    for (SimJob& j : jobs) {
      if (j.start_s >= 0 && j.end_s <= now) {
        if (!j.done) {
          j.done = true;
          ++finished;
        }
        continue;
      }
      if (j.start_s >= 0 && j.end_s > now) {
        ledger.Charge(j.spec.user, static_cast<double>(j.spec.devices) * (now - charged), now);
        held += j.spec.devices;
        held_by_user[j.spec.user] += j.spec.devices;
        view.running.push_back(RunningJob{.id = j.spec.id,
                                          .user = j.spec.user,
                                          .priority = j.spec.priority,
                                          .kind = "gpu",
                                          .devices = j.spec.devices,
                                          .started_s = j.start_s,
                                          .runtime_s = j.spec.runtime_s});
      } else if (j.start_s < 0 && j.submit_s <= now) {
        view.waiting.push_back(j.spec);
      }
    }
    charged = now;
    view.free["gpu"] = config.devices - held;
    view.quotas = quotas;
    view.usage = ledger.UsageAt(now);
    const std::vector<Decision> decisions = Decide(view, config.policy);
    ++result.decide_calls;
    result.decisions += static_cast<int64_t>(decisions.size());
    std::map<std::string, SimJob*> by_id;
    for (SimJob& j : jobs) by_id[j.spec.id] = &j;
    bool reserved = false;  // a job ahead waits for devices (not quota, not too large)
    int64_t free = config.devices - held;
    for (const Decision& d : decisions) {
      SimJob& j = *by_id[d.job_id];
      const bool quota_wait = d.reason.rfind("quota:", 0) == 0;
      if (d.action == Action::kStart || d.action == Action::kBackfill) {
        if (d.action == Action::kStart && reserved) {
          result.violations.push_back(
              absl::StrCat(d.job_id, " started ahead of a reservation at t=", now));
        }
        if (j.spec.devices > free) {
          result.violations.push_back(absl::StrCat(d.job_id, " started without free devices"));
        }
        auto q = config.user_quota.find(j.spec.user);
        if (q != config.user_quota.end() &&
            held_by_user[j.spec.user] + j.spec.devices > q->second) {
          result.violations.push_back(absl::StrCat(d.job_id, " took ", j.spec.user,
                                                   " above its quota at t=", now));
        }
        free -= j.spec.devices;
        held_by_user[j.spec.user] += j.spec.devices;
        j.start_s = now;
        j.end_s = now + j.actual_s;
        j.how = d.action;
        result.max_wait_s = std::max(result.max_wait_s, now - j.submit_s);
      } else if (d.action == Action::kWait && !quota_wait &&
                 d.reason.find("the cluster has") == std::string::npos) {
        reserved = true;
      }
    }
  }
  result.end_s = now;
  return result;
}

}  // namespace loom::coordinator::sched::testing
