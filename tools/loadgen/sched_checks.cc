#include "tools/loadgen/sched_checks.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::loadgen {
namespace {

Percentiles Summarize(std::vector<double> values) {
  Percentiles p;
  p.count = static_cast<int64_t>(values.size());
  if (values.empty()) return p;
  std::sort(values.begin(), values.end());
  auto at = [&](double q) {
    return values[std::min(values.size() - 1, static_cast<size_t>(q * values.size()))];
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  p.max = values.back();
  return p;
}

bool Holds(const SchedJobOutcome& j, double from, double to) {
  // Held devices at some moment of [from, to]: started by `to`, not ended before `from`.
  return j.start_s >= 0 && j.start_s <= to && (j.end_s < 0 || j.end_s > from);
}

// Rule 2 on the coordinator's record: at each start, exactly.
void CheckCapacityAndQuotas(const SchedCheckInput& in, SchedCheckResult& out) {
  for (const SchedJobOutcome& s : in.jobs) {
    if (s.start_s < 0) continue;
    int64_t held = 0;
    std::map<std::string, int64_t> by_user;
    for (const SchedJobOutcome& j : in.jobs) {
      if (j.start_s >= 0 && j.start_s <= s.start_s && (j.end_s < 0 || j.end_s > s.start_s)) {
        held += j.devices;
        by_user[j.user] += j.devices;
      }
    }
    if (held > in.capacity) {
      out.violations.push_back(absl::StrFormat("%s started at %.3f s with %d of %d GPUs held", s.id,
                                               s.start_s, held, in.capacity));
    }
    if (auto q = in.gpu_quota.find(s.user);
        q != in.gpu_quota.end() && by_user[s.user] > q->second) {
      out.violations.push_back(absl::StrFormat("%s started at %.3f s: %s holds %d GPUs, quota %d",
                                               s.id, s.start_s, s.user, by_user[s.user],
                                               q->second));
    }
  }
}

// Rule 2 on the nodes' record: no device doubly given, no user above quota.
void CheckDevices(const SchedCheckInput& in,
                  const std::map<std::string, const SchedJobOutcome*>& by_id,
                  SchedCheckResult& out) {
  std::vector<DeviceEvent> events = in.events;
  std::stable_sort(events.begin(), events.end(), [](const DeviceEvent& a, const DeviceEvent& b) {
    if (a.time_s != b.time_s) return a.time_s < b.time_s;
    return !a.launch && b.launch;  // an exit at the same moment first
  });
  std::map<std::pair<std::string, int32_t>, std::string> running;
  std::map<std::string, int64_t> user_held;
  for (const DeviceEvent& e : events) {
    const auto key = std::pair{e.node, e.device};
    auto job = by_id.find(e.job_id);
    const std::string user = job == by_id.end() ? "" : job->second->user;
    if (e.launch) {
      if (auto r = running.find(key); r != running.end()) {
        out.violations.push_back(absl::StrFormat("device %d of %s given to %s while %s ran there",
                                                 e.device, e.node, e.job_id, r->second));
      }
      running[key] = e.job_id;
      if (job == by_id.end()) {
        out.violations.push_back(absl::StrCat(e.node, " ran a rank of unknown job ", e.job_id));
        continue;
      }
      const int64_t held = ++user_held[user];
      if (auto q = in.gpu_quota.find(user); q != in.gpu_quota.end() && held > q->second) {
        out.violations.push_back(absl::StrFormat("the nodes ran %d ranks of %s at %.3f s, quota %d",
                                                 held, user, e.time_s, q->second));
      }
    } else {
      running.erase(key);
      if (job != by_id.end()) --user_held[user];
    }
  }
}

// Rule 3.
void CheckPriorityOrder(const SchedCheckInput& in, SchedCheckResult& out) {
  const double tol = in.tolerance_s;
  for (const SchedJobOutcome& l : in.jobs) {
    if (l.start_s < 0) continue;
    const double t = l.start_s;
    // Everything that held devices near this start, but the job itself (a
    // job ahead of it in the same pass would have been placed first).
    int64_t held = 0;
    std::map<std::string, int64_t> user_held;
    for (const SchedJobOutcome& k : in.jobs) {
      if (&k == &l || !Holds(k, t - tol, t + tol)) continue;
      held += k.devices;
      user_held[k.user] += k.devices;
    }
    for (const SchedJobOutcome& h : in.jobs) {
      if (h.priority <= l.priority || h.submit_s >= t - tol) continue;
      // Waiting then: a job that started within the window holds devices above.
      if (h.start_s >= 0 && h.start_s <= t + tol) continue;
      const bool fits = in.capacity - held >= h.devices;
      auto q = in.gpu_quota.find(h.user);
      const bool in_quota = q == in.gpu_quota.end() || user_held[h.user] + h.devices <= q->second;
      if (fits && in_quota) {
        out.violations.push_back(absl::StrFormat(
            "%s (priority %d) started at %.3f s while %s (priority %d, %d GPUs) waited and fitted "
            "(%d GPUs free counting every job within %.1f s)",
            l.id, l.priority, t, h.id, h.priority, h.devices, in.capacity - held, tol));
        break;  // one line per start
      }
    }
  }
}

// Rule 4, and the waits.
void CheckFairShareBound(const SchedCheckInput& in, SchedCheckResult& out) {
  double longest = 0;
  for (const SchedJobOutcome& j : in.jobs) {
    if (j.start_s >= 0 && j.end_s >= 0) longest = std::max(longest, j.end_s - j.start_s);
  }
  std::map<int64_t, std::pair<double, int>> waits;
  std::vector<double> all_waits;
  for (const SchedJobOutcome& j : in.jobs) {
    if (j.start_s < 0) continue;
    double ahead = 0, own = 0;
    for (const SchedJobOutcome& k : in.jobs) {
      if (&k == &j || k.submit_s > j.start_s || k.start_s < 0 || k.end_s < 0) continue;
      const double work = static_cast<double>(k.devices) * (k.end_s - k.start_s);
      if (k.priority >= j.priority) ahead += work;
      if (k.user == j.user) own += work;
    }
    double bound = 2 * ahead / static_cast<double>(in.capacity) + 2 * longest + in.slack_s;
    if (auto q = in.gpu_quota.find(j.user); q != in.gpu_quota.end()) {
      bound += own / static_cast<double>(q->second);
    }
    const double wait = j.start_s - j.submit_s;
    out.worst_bound_ratio = std::max(out.worst_bound_ratio, wait / bound);
    if (wait > bound) {
      out.violations.push_back(absl::StrFormat(
          "%s (priority %d, %s) waited %.1f s, beyond its fair-share bound of %.1f s", j.id,
          j.priority, j.user, wait, bound));
    }
    waits[j.priority].first += wait;
    waits[j.priority].second += 1;
    all_waits.push_back(wait);
  }
  for (const auto& [priority, sum] : waits) {
    out.mean_wait_by_priority[priority] = sum.first / sum.second;
  }
  out.wait_s = Summarize(all_waits);
}

// Whether some job was waiting (submitted, not started) at time t.
bool SomeoneWaits(const std::vector<SchedJobOutcome>& jobs, double t) {
  for (const SchedJobOutcome& j : jobs) {
    if (j.submit_s <= t && (j.start_s < 0 || j.start_s > t)) return true;
  }
  return false;
}

void Measure(const SchedCheckInput& in, SchedCheckResult& out) {
  double first_submit = 1e300, last_end = 0, first_end = 1e300, first_start = 1e300, work = 0;
  std::vector<double> starts, ends;
  for (const SchedJobOutcome& j : in.jobs) {
    first_submit = std::min(first_submit, j.submit_s);
    if (j.start_s >= 0) {
      first_start = std::min(first_start, j.start_s);
      starts.push_back(j.start_s);
    }
    if (j.end_s >= 0) {
      last_end = std::max(last_end, j.end_s);
      first_end = std::min(first_end, j.end_s);
      ends.push_back(j.end_s);
      if (j.start_s >= 0) work += static_cast<double>(j.devices) * (j.end_s - j.start_s);
    }
  }
  if (starts.empty()) return;
  out.makespan_s = last_end - first_submit;
  if (out.makespan_s > 0)
    out.utilization = work / (static_cast<double>(in.capacity) * out.makespan_s);
  double last_wave_start = first_start;
  for (double s : starts) {
    if (s < first_end) {
      ++out.first_wave_starts;
      last_wave_start = std::max(last_wave_start, s);
    }
  }
  if (out.first_wave_starts > 1 && last_wave_start > first_start) {
    out.first_wave_rate =
        static_cast<double>(out.first_wave_starts - 1) / (last_wave_start - first_start);
  }
  std::sort(starts.begin(), starts.end());
  std::vector<double> reactions;
  for (double e : ends) {
    auto next = std::upper_bound(starts.begin(), starts.end(), e);
    if (next != starts.end() && SomeoneWaits(in.jobs, e)) reactions.push_back(*next - e);
  }
  out.reaction_s = Summarize(reactions);
  // A device's exit to its next launch, counted when jobs waited at its exit.
  std::map<std::pair<std::string, int32_t>, std::vector<const DeviceEvent*>> by_device;
  for (const DeviceEvent& e : in.events) by_device[{e.node, e.device}].push_back(&e);
  std::vector<double> idle;
  for (auto& [device, events] : by_device) {
    std::sort(events.begin(), events.end(),
              [](const DeviceEvent* a, const DeviceEvent* b) { return a->time_s < b->time_s; });
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      if (!events[i]->launch && events[i + 1]->launch && SomeoneWaits(in.jobs, events[i]->time_s)) {
        idle.push_back(events[i + 1]->time_s - events[i]->time_s);
      }
    }
  }
  out.device_idle_s = Summarize(idle);
}

}  // namespace

SchedCheckResult CheckSchedulingRun(const SchedCheckInput& input) {
  SchedCheckResult out;
  std::map<std::string, const SchedJobOutcome*> by_id;
  for (const SchedJobOutcome& j : input.jobs) {
    by_id[j.id] = &j;
    if (!j.succeeded || j.attempts != 1) {
      out.violations.push_back(
          absl::StrFormat("%s did not succeed in one attempt (%s, %d attempts)", j.id,
                          j.succeeded ? "succeeded" : "not succeeded", j.attempts));
    }
  }
  CheckCapacityAndQuotas(input, out);
  CheckDevices(input, by_id, out);
  CheckPriorityOrder(input, out);
  CheckFairShareBound(input, out);
  Measure(input, out);
  return out;
}

}  // namespace loom::loadgen
