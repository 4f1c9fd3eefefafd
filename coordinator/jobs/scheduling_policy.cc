#include "coordinator/jobs/scheduling_policy.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::coordinator::sched {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

int64_t Get(const std::map<std::string, int64_t>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

// The first job of a kind that could not start: what it needs and when it is
// expected to start.
struct Reservation {
  const WaitingJob* head = nullptr;
  double start_s = kNever;
  // Devices free at start_s beyond what the head needs: a job may use them
  // whenever it ends.
  int64_t extra = 0;
};

std::string Seconds(double s) {
  if (s < 120) return absl::StrFormat("%.0f s", s);
  if (s < 7200) return absl::StrFormat("%.0f min", s / 60);
  return absl::StrFormat("%.1f h", s / 3600);
}

class Walk {
 public:
  Walk(const ClusterView& view, const PolicyOptions& options) : view_(view), options_(options) {
    free_ = view.free;
    for (const RunningJob& r : view.running) {
      Hold(r.user, r.kind, r.devices);
      if (r.stopping) soon_[r.kind] += r.devices;
    }
  }

  Decision Next(const WaitingJob& job) {
    Decision d;
    d.job_id = job.id;
    const int64_t capacity = Get(view_.capacity, job.kind);
    if (job.devices > capacity) {
      d.reason = absl::StrCat("needs ", job.devices, " ", job.kind, ", the cluster has ", capacity);
      return d;
    }
    if (std::string over = OverQuota(job); !over.empty()) {
      const bool idle = reservations_.count(job.kind) == 0 && !job.unplaceable &&
                        job.devices <= Get(free_, job.kind);
      if (options_.borrowing && idle) {
        d.action = Action::kStart;
        d.borrowed = true;
        d.reason = absl::StrCat("borrows idle devices (", over, "); preempted first");
        Take(job);
        return d;
      }
      d.reason = over;
      return d;
    }
    auto reserved = reservations_.find(job.kind);
    if (reserved != reservations_.end()) return Behind(job, reserved->second);
    const int64_t free = Get(free_, job.kind);
    if (job.devices <= free && !job.unplaceable) {
      d.action = Action::kStart;
      d.reason = absl::StrCat("fits: ", job.devices, " of ", free, " ", job.kind, " free");
      Take(job);
      return d;
    }
    // Devices of jobs already told to stop come free for the first jobs that
    // need them; nobody else is stopped for them.
    const int64_t soon = soon_[job.kind];
    if (job.devices <= free + soon && !job.unplaceable) {
      soon_[job.kind] -= std::max<int64_t>(0, job.devices - free);
      Reserve(job, view_.now_s, 0);
      d.reason = absl::StrCat("waits for ", job.devices - free, " ", job.kind,
                              " of preempted jobs to come free");
      d.reserved_start_s = view_.now_s;
      return d;
    }
    if (options_.preemption && !job.unplaceable) {
      std::vector<const RunningJob*> victims = Victims(job, free + soon);
      if (!victims.empty()) {
        int64_t freed = 0;
        d.action = Action::kPreempt;
        for (const RunningJob* v : victims) {
          chosen_.insert(v->id);
          d.victims.push_back(v->id);
          freed += v->devices;
        }
        soon_[job.kind] = 0;
        // The preemptor takes every free device it needs as soon as the
        // victims stop; what is left over may be used meanwhile.
        Reserve(job, view_.now_s, std::max<int64_t>(0, free + soon + freed - job.devices));
        d.reason = absl::StrCat("preempts ", d.victims.size(), " job(s) of lower priority for ",
                                freed, " ", job.kind);
        return d;
      }
    }
    ReserveFromEnds(job, free + soon);
    d.reserved_start_s = reservations_[job.kind].start_s;
    d.reason = job.unplaceable
                   ? absl::StrCat("needs ", job.devices, " ", job.kind,
                                  " on nodes that hold its layout, ", free, " free")
                   : absl::StrCat("needs ", job.devices, " ", job.kind, ", ", free, " free");
    if (std::isfinite(d.reserved_start_s)) {
      absl::StrAppend(&d.reason, "; expected to start in ",
                      Seconds(d.reserved_start_s - view_.now_s));
    }
    return d;
  }

 private:
  // Why the job would take its owner or its owner's group above a quota;
  // empty when it would not.
  std::string OverQuota(const WaitingJob& job) const {
    auto user_quota = view_.quotas.users.find({job.user, job.kind});
    if (user_quota != view_.quotas.users.end()) {
      const int64_t held = Held(user_held_, job.user, job.kind);
      if (held + job.devices > user_quota->second) {
        return QuotaText(job.user, held, user_quota->second, job);
      }
    }
    auto group = view_.quotas.group_of.find(job.user);
    if (group == view_.quotas.group_of.end()) return "";
    auto group_quota = view_.quotas.groups.find({group->second, job.kind});
    if (group_quota != view_.quotas.groups.end()) {
      const int64_t held = Held(group_held_, group->second, job.kind);
      if (held + job.devices > group_quota->second) {
        return QuotaText(absl::StrCat("group ", group->second), held, group_quota->second, job);
      }
    }
    return "";
  }

  static std::string QuotaText(const std::string& who, int64_t held, int64_t quota,
                               const WaitingJob& job) {
    if (job.devices > quota) {
      return absl::StrCat("quota: ", who, " may hold ", quota, " ", job.kind, ", the job needs ",
                          job.devices);
    }
    return absl::StrCat("quota: ", who, " holds ", held, " of ", quota, " ", job.kind,
                        ", the job needs ", job.devices);
  }

  static int64_t Held(const std::map<std::pair<std::string, std::string>, int64_t>& held,
                      const std::string& who, const std::string& kind) {
    auto it = held.find({who, kind});
    return it == held.end() ? 0 : it->second;
  }

  void Hold(const std::string& user, const std::string& kind, int64_t devices) {
    user_held_[{user, kind}] += devices;
    auto group = view_.quotas.group_of.find(user);
    if (group != view_.quotas.group_of.end()) group_held_[{group->second, kind}] += devices;
  }

  void Take(const WaitingJob& job) {
    free_[job.kind] -= job.devices;
    Hold(job.user, job.kind, job.devices);
    started_.push_back(&job);
  }

  void Reserve(const WaitingJob& job, double start_s, int64_t extra) {
    reservations_[job.kind] = Reservation{.head = &job, .start_s = start_s, .extra = extra};
  }

  // The earliest time `job` fits, from the running jobs' promised ends (a job
  // without a promise never ends, as far as this is concerned).
  void ReserveFromEnds(const WaitingJob& job, int64_t available) {
    std::vector<std::pair<double, int64_t>> ends;
    for (const RunningJob& r : view_.running) {
      if (r.kind != job.kind || r.stopping || chosen_.count(r.id) != 0) continue;
      ends.emplace_back(r.runtime_s > 0 ? r.started_s + r.runtime_s : kNever, r.devices);
    }
    for (const WaitingJob* w : started_) {
      if (w->kind != job.kind) continue;
      ends.emplace_back(w->runtime_s > 0 ? view_.now_s + w->runtime_s : kNever, w->devices);
    }
    std::sort(ends.begin(), ends.end());
    for (const auto& [end, devices] : ends) {
      if (!std::isfinite(end)) break;
      available += devices;
      if (available >= job.devices && !job.unplaceable) {
        Reserve(job, std::max(end, view_.now_s), available - job.devices);
        return;
      }
    }
    Reserve(job, kNever, 0);
  }

  // Running jobs that may be stopped for `job`, fewest that free enough, or
  // none when even all of them would not.
  std::vector<const RunningJob*> Victims(const WaitingJob& job, int64_t available) const {
    std::vector<const RunningJob*> candidates;
    for (const RunningJob& r : view_.running) {
      if (r.kind != job.kind || r.stopping || !r.preemptible || chosen_.count(r.id) != 0) continue;
      // The owner of a quota reclaims what others borrowed, whatever their priority.
      const bool reclaim = r.borrowed && r.user != job.user;
      if (r.priority < job.priority || reclaim) candidates.push_back(&r);
    }
    std::sort(candidates.begin(), candidates.end(),
              [](const RunningJob* a, const RunningJob* b) {
                if (a->borrowed != b->borrowed) return a->borrowed;
                if (a->priority != b->priority) return a->priority < b->priority;
                if (a->work_lost != b->work_lost) return a->work_lost < b->work_lost;
                if (a->started_s != b->started_s) return a->started_s > b->started_s;
                return a->id < b->id;
              });
    std::vector<const RunningJob*> victims;
    for (const RunningJob* c : candidates) {
      if (available >= job.devices) break;
      victims.push_back(c);
      available += c->devices;
    }
    if (available < job.devices) return {};
    return victims;
  }

  // A job behind the reservation of its kind: it starts now only when it
  // does not delay the reserved job.
  Decision Behind(const WaitingJob& job, Reservation& reservation) {
    Decision d;
    d.job_id = job.id;
    const WaitingJob& head = *reservation.head;
    const int64_t free = Get(free_, job.kind);
    const bool fits = job.devices <= free && !job.unplaceable;
    const bool ends_first = job.runtime_s > 0 && std::isfinite(reservation.start_s) &&
                            view_.now_s + job.runtime_s <= reservation.start_s;
    const bool spare = job.devices <= reservation.extra;
    if (options_.backfill && fits && (ends_first || spare)) {
      d.action = Action::kBackfill;
      d.reason = ends_first ? absl::StrCat("backfills: ends before ", head.id, "'s reserved start")
                            : absl::StrCat("backfills: uses devices ", head.id, " does not need");
      if (ends_first && job.runtime_predicted) {
        absl::StrAppend(&d.reason, " (the planner predicts ", Seconds(job.runtime_s), ")");
      }
      if (!ends_first) reservation.extra -= job.devices;
      Take(job);
      return d;
    }
    d.reserved_start_s = reservation.start_s;
    d.behind = head.id;
    if (head.priority > job.priority) {
      d.reason = absl::StrCat("priority ", job.priority, ", behind ", head.id, " (priority ",
                              head.priority, ")");
    } else {
      d.reason = absl::StrCat("behind ", head.id, " (priority ", head.priority, ", waiting for ",
                              head.devices, " ", head.kind, ")");
    }
    if (!fits) {
      absl::StrAppend(&d.reason, "; needs ", job.devices, " ", job.kind, ", ", free, " free");
    } else if (job.runtime_s <= 0) {
      absl::StrAppend(&d.reason, "; no scheduling.max_runtime_s to backfill with");
    } else if (job.runtime_predicted) {
      absl::StrAppend(&d.reason, "; the planner predicts it runs ", Seconds(job.runtime_s),
                      ", past ", head.id, "'s reserved start");
    } else {
      absl::StrAppend(&d.reason, "; would still run at ", head.id, "'s reserved start");
    }
    return d;
  }

  const ClusterView& view_;
  const PolicyOptions& options_;
  std::map<std::string, int64_t> free_;
  std::map<std::string, int64_t> soon_;  // devices of stopping jobs not yet promised
  std::map<std::pair<std::string, std::string>, int64_t> user_held_;
  std::map<std::pair<std::string, std::string>, int64_t> group_held_;
  std::map<std::string, Reservation> reservations_;  // by kind
  std::set<std::string> chosen_;                     // victims already picked
  std::vector<const WaitingJob*> started_;           // started by this walk
};

}  // namespace

const char* ActionName(Action action) {
  switch (action) {
    case Action::kStart:
      return "start";
    case Action::kBackfill:
      return "backfill";
    case Action::kPreempt:
      return "preempt";
    case Action::kWait:
      return "wait";
  }
  return "wait";
}

std::vector<size_t> QueueOrder(const ClusterView& view) {
  std::vector<size_t> order(view.waiting.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto usage = [&view](const std::string& user) {
    auto it = view.usage.find(user);
    return it == view.usage.end() ? 0.0 : it->second;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const WaitingJob& x = view.waiting[a];
    const WaitingJob& y = view.waiting[b];
    if (x.priority != y.priority) return x.priority > y.priority;
    const double ux = usage(x.user);
    const double uy = usage(y.user);
    if (ux != uy) return ux < uy;
    if (x.order != y.order) return x.order < y.order;
    return x.id < y.id;
  });
  return order;
}

std::vector<Decision> Decide(const ClusterView& view, const PolicyOptions& options) {
  std::vector<Decision> decisions;
  decisions.reserve(view.waiting.size());
  Walk walk(view, options);
  for (size_t i : QueueOrder(view)) decisions.push_back(walk.Next(view.waiting[i]));
  return decisions;
}

}  // namespace loom::coordinator::sched
