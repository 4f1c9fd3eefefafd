// The scheduling policy (docs/scheduling.md): which waiting job goes next on a
// shared cluster, and why every other one waits. Pure: it takes a view of the
// cluster (free devices, the waiting and the running jobs, quotas, recent
// usage) and returns one decision per waiting job, in queue order. The
// scheduler (job_scheduler.h) builds the view under the job table's lock,
// acts on the decisions and places each job it starts on nodes
// (topology::PlaceRanks); `loomctl queue` shows the reasons.
//
// The rules, in order:
//   - The queue is ordered by priority (higher first), then by fair share
//     (the owner's decayed device-seconds, less first), then by submission.
//   - A job larger than every device of its kind the cluster knows waits
//     without holding up anyone.
//   - A job that would take its owner (or its owner's group) above a quota
//     waits, saying so, without holding up anyone; with borrowing on it may
//     start on idle devices, and is then the first to be preempted.
//   - The first job of a device kind that does not fit holds a reservation:
//     the earliest time enough devices come free, from the running jobs'
//     promised runtimes (EASY backfill). A job behind it starts only when it
//     fits now and either ends before that time or uses devices the reserved
//     job does not need.
//   - With preemption on, a job that does not fit may stop running jobs of
//     lower priority (and jobs running on borrowed quota): the victims are
//     the lowest priority first, then the least work lost, then the most
//     recently started, and only as many as the job needs.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom::coordinator::sched {

struct PolicyOptions {
  bool backfill = true;
  // Acted on only where running jobs can be stopped without losing work.
  bool preemption = false;
  // An over-quota job may start on devices nobody waits for.
  bool borrowing = false;
};

// Devices of one kind ("cpu", "gpu") a user or a group may hold at once.
struct Quotas {
  std::map<std::pair<std::string, std::string>, int64_t> users;   // (user, kind)
  std::map<std::pair<std::string, std::string>, int64_t> groups;  // (group, kind)
  std::map<std::string, std::string> group_of;                    // user -> group
};

struct WaitingJob {
  std::string id;
  std::string user;
  int64_t priority = 0;
  std::string kind;
  int64_t devices = 0;
  int64_t order = 0;     // submission order: lower was submitted first
  double runtime_s = 0;  // promised (or estimated) seconds it runs; 0: unknown
  bool runtime_predicted = false;  // runtime_s is the planner's estimate, not a promise
  // The scheduler found no nodes to hold its layout although enough devices
  // are free (a TP group must stay inside a node): it waits like a job that
  // does not fit.
  bool unplaceable = false;
};

struct RunningJob {
  std::string id;
  std::string user;
  int64_t priority = 0;
  std::string kind;
  int64_t devices = 0;
  double started_s = 0;   // on the view's clock
  double runtime_s = 0;   // promised seconds; 0: unknown (runs forever as far as backfill knows)
  int64_t work_lost = 0;  // device-steps a stop now would lose (since its newest save)
  bool borrowed = false;  // started over its owner's quota
  bool stopping = false;  // told to stop: its devices come free soon; never a victim again
  // It can stop without losing work (it saves checkpoints and is running).
  bool preemptible = true;
};

struct ClusterView {
  double now_s = 0;
  std::map<std::string, int64_t> free;      // free devices on nodes that take work, by kind
  std::map<std::string, int64_t> capacity;  // devices of every node known, by kind
  std::vector<WaitingJob> waiting;
  std::vector<RunningJob> running;
  Quotas quotas;
  std::map<std::string, double> usage;  // decayed device-seconds by user
};

enum class Action {
  kStart,     // fits now
  kBackfill,  // fits now, behind a reservation it does not delay
  kPreempt,   // stop the victims, then start
  kWait,
};
const char* ActionName(Action action);

struct Decision {
  std::string job_id;
  Action action = Action::kWait;
  std::vector<std::string> victims;  // kPreempt, in the order chosen
  bool borrowed = false;             // starts over its owner's quota
  std::string reason;                // why it waits, or what lets it start
  std::string behind;                // the waiting job it is held behind, if any
  // kWait behind a reservation: when the first waiting job of its kind is
  // expected to start (infinity: not known).
  double reserved_start_s = std::numeric_limits<double>::infinity();
};

// The waiting jobs in queue order (indices into view.waiting).
std::vector<size_t> QueueOrder(const ClusterView& view);

// One decision per waiting job, in queue order. Decisions build on each
// other: a started job's devices are no longer free for the ones after it.
std::vector<Decision> Decide(const ClusterView& view, const PolicyOptions& options);

}  // namespace loom::coordinator::sched
