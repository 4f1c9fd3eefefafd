// The scheduler: one thread that places jobs and sends every message to the
// agents. A placement pass asks the scheduling policy (scheduling_policy.h:
// priority, fair share, submission order, quotas, EASY backfill) which
// waiting job goes next, with the devices other jobs hold, under the job
// table's mutex, and keeps the policy's queue with its reasons for
// `loomctl queue`; places the job and builds every rank's assignment without the lock; and
// commits through the lifecycle only if nothing it read has changed. An
// in-place recovery ready to be decided goes first (its job holds its
// devices already): the decision (in_place_policy.h's DecideInPlace) and
// attempt n+1's assignments are made the same way, without the lock, and
// committed, or the recovery falls back to the whole job. The messages the
// table releases (a launch once its attempt is stored, a kill) are sent from
// here after unlocking, in the order they were queued, so a large job's
// placement never stalls other calls, heartbeats included.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"
#include "common/topology/placement.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/jobs/elastic_policy.h"
#include "coordinator/jobs/fair_share.h"
#include "coordinator/jobs/in_place_policy.h"
#include "coordinator/jobs/job_lifecycle.h"
#include "coordinator/jobs/job_paths.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/jobs/scheduling_policy.h"
#include "coordinator/service/metrics.h"
#include "coordinator/service/scheduler_metrics.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

struct SchedulerOptions {
  double collective_timeout_s = 60;
  // Issues each rank's bearer token (RankAssignment.rank_token) from its
  // assignment; empty: ranks get none (--insecure, tests).
  std::function<std::string(const loom::v1::RankAssignment&)> rank_token_issuer;
  // A launch message larger than this is never sent (the transport would drop
  // the session); the job fails instead.
  int64_t max_launch_bytes = 16 * 1024 * 1024;
  FileRoots roots;  // with its defaults filled in
  // The queue's rules (docs/scheduling.md); preemption stays off until
  // running jobs can be stopped without losing a step.
  sched::PolicyOptions policy;
  // Fair share: how fast a user's past use of devices is forgotten.
  double fair_share_half_life_s = 7 * 24 * 3600.0;
  // The quotas in force, read on every pass (under the job table's lock, so
  // it must never take that lock); empty: no quotas.
  std::function<sched::Quotas()> quotas;
  // Where the queue's metrics go (not owned); null: none (tests).
  CoordinatorMetrics* metrics = nullptr;
};

// One waiting job as the last placement pass saw it, in queue order.
struct QueueEntry {
  std::string job_id;
  std::string owner;
  int64_t priority = 0;
  std::string kind;
  int64_t devices = 0;
  int64_t created_unix_ms = 0;
  sched::Action action = sched::Action::kWait;
  std::string reason;
  std::string behind;  // the waiting job it is held behind, if any
};

class JobScheduler {
 public:
  JobScheduler(SchedulerOptions options, JobTable* table, JobLifecycle* lifecycle,
               NodeRegistry* nodes);
  ~JobScheduler();  // Stop()
  JobScheduler(const JobScheduler&) = delete;
  JobScheduler& operator=(const JobScheduler&) = delete;

  void Start();
  // Sends what is queued, then ends the thread.
  void Stop();
  // Asks for a placement pass; returns at once.
  void Schedule();
  // Returns once every pass asked for and every message queued before the
  // call have been handled (tests).
  void WaitHandled();

  // What a placement pass copies out under the lock to place one job without it.
  struct Snapshot {
    std::string job_id;
    loom::v1::JobState state = loom::v1::PENDING;
    int32_t attempt = 0;  // before this placement
    bool borrowed = false;  // the policy lets it start over its owner's quota
    spec::JobSpec spec;
    std::string resolved_spec_yaml;
    std::string spec_yaml;  // as submitted: an elastic job's requested size
    std::string owner;
    std::string checkpoint_dir;  // Job.checkpoint_dir: <checkpoint_root>/<owner>/<id>
    uint32_t run_uid = 0;          // Job.run_uid and Job.resume_from_uid
    uint32_t resume_from_uid = 0;
    std::set<std::string> avoid;                     // nodes that failed this job
    std::map<std::string, std::set<int32_t>> taken;  // devices other jobs hold, by node
    // An in-place recovery to decide (the job is RECOVERING): the survivors'
    // reports and the live nodes' free devices of now.
    std::optional<InPlaceRequest> relaunch;
  };
  struct Result {
    bool fits = false;
    absl::Status error;  // the job can never be placed as specified: it fails
    PlacedAttempt attempt;
    std::set<std::string> nodes;
    // In place: the decision, or why the whole job restarts instead.
    std::optional<InPlaceDecision> in_place;
    std::string fallback;
    // An elastic job placed at another size than its spec's: the resize
    // (job_scheduler_elastic.cc).
    std::optional<ElasticDecision> resize;
    // Not placed: why, when the job has something to say (an elastic job
    // below fault_tolerance.min_ranks); it goes to the job's history once.
    std::string waits_because;
  };
  // What the nodes offer, read from the registry before taking the lock.
  struct Devices {
    std::map<std::string, int64_t> capacity;  // every node known, live or not, by kind
    // Live, connected nodes (those that take new ranks): kind and device count.
    std::map<std::string, std::pair<std::string, int32_t>> nodes;
  };
  Devices ReadDevices() const;
  // The job the scheduling policy starts next, if any (false: every waiting
  // job waits); keeps the policy's queue for Queue(). unplaceable: jobs this
  // pass found no nodes for although enough devices were free.
  bool SnapshotNextLocked(const Devices& devices, const std::set<std::string>& unplaceable,
                          Snapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // The waiting jobs in queue order with why each waits, as the last pass
  // left them.
  std::vector<QueueEntry> Queue() const;
  // An in-place recovery ready to be decided; false when none is.
  bool SnapshotRelaunchLocked(Snapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Places the snapshot's job on the live nodes' free devices (no lock).
  Result Place(const Snapshot& snapshot) const;
  // Decides the snapshot's in-place recovery and builds attempt n+1 over
  // the decision's placement (no lock; job_scheduler_in_place.cc).
  Result PlaceInPlace(const Snapshot& snapshot) const;

 private:
  void Loop();
  // Places pending jobs first come, first served, until one does not fit.
  void RunPass();
  // Records a placement computed without the lock, unless the job or its
  // nodes changed meanwhile (then false: the pass starts over).
  bool CommitLocked(const Snapshot& snapshot, Result& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  bool CommitInPlaceLocked(const Snapshot& snapshot, Result& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Every rank's assignment over a placement (tokens, snapshot rings; with
  // `in_place`, its restore plans and rings), the placement record and the
  // peak FLOP/s, into result.attempt; an error when a launch would exceed
  // the transport's limit (the job then fails).
  // An elastic job (fault_tolerance.min_ranks) placed again after a failure
  // or to grow back: at the largest size the free devices allow, up to the
  // requested one, when that is not its spec's (job_scheduler_elastic.cc).
  // nullopt: placed at its spec's size as any job.
  std::optional<Result> PlaceElastic(const Snapshot& snapshot,
                                     const topology::PlacementRequest& request) const;
  // The job's own spares (resources.spares) from the devices the placement
  // left free, nodes without its ranks first. A first placement that finds
  // too few does not fit (ranks and spares come together); a job placed
  // again (`first` false) runs with the spares there are rather than idle
  // its ranks' devices waiting for the ones it lost.
  static void ReserveSpares(const spec::JobSpec& spec, const topology::PlacementRequest& request,
                            const topology::Placement& placement, bool first, Result& result);
  void BuildAttempt(const Snapshot& snapshot, const topology::Placement& placement,
                    const InPlaceDecision* in_place, Result& result) const;
  void Flush();
  // Adds each running job's device-seconds since the last charge to its
  // owner's fair share.
  void ChargeUsageLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());

  const SchedulerOptions options_;
  JobTable* const table_;
  JobLifecycle* const lifecycle_;
  NodeRegistry* const nodes_;
  bool stopping_ ABSL_GUARDED_BY(table_->mu()) = false;
  int64_t handled_ ABSL_GUARDED_BY(table_->mu()) = 0;  // schedule requests handled
  sched::FairShareLedger usage_ ABSL_GUARDED_BY(table_->mu());
  absl::Time charged_at_ ABSL_GUARDED_BY(table_->mu()) = absl::InfinitePast();
  std::unique_ptr<SchedulerMetrics> metrics_;  // null without options_.metrics
  // Read by the queue's readers without the table's lock.
  mutable absl::Mutex queue_mu_;
  std::vector<QueueEntry> queue_ ABSL_GUARDED_BY(queue_mu_);
  std::thread thread_;
};

}  // namespace loom::coordinator
