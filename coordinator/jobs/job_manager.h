// The JobManager owns every job: admission (parse, validate, resolve the
// layout, persist), placement onto live nodes, the state machine, progress
// aggregation, rank exits and restarts, and the watchers of each job. The gRPC
// handlers are thin translations onto these methods.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/health/hang_detector.h"
#include "coordinator/health/recovery_accounting.h"
#include "coordinator/jobs/job_paths.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/rendezvous/kv_store.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

class CoordinatorMetrics;

// Receives a watched job's updates; Push must not call back into the manager.
class WatchSink {
 public:
  virtual ~WatchSink() = default;
  // last: the job has ended and this is the final update.
  virtual void Push(const loom::v1::WatchJobResponse& update, bool last) = 0;
};

// Fills the axes a spec leaves to the planner and checks that the engine can
// run the result, or says why not (coordinator/service/plan_service.h).
using LayoutResolver = std::function<absl::Status(spec::JobSpec&)>;

struct JobManagerOptions {
  std::string state_dir;
  double kill_grace_seconds = 5;
  double collective_timeout_s = 60;
  // After a coordinator restart, nodes that ran a job's ranks get this long
  // to reconnect before they count as lost.
  absl::Duration recovery_grace = absl::Seconds(10);
  HangPolicy hang_policy;  // fixed_timeout comes from each job's spec
  // Issues each rank's bearer token (RankAssignment.rank_token) from its
  // assignment; empty: ranks get none (--insecure, tests).
  std::function<std::string(const loom::v1::RankAssignment&)> rank_token_issuer;
  // Admission bounds (docs/limits.md): the YAML's size and the most ranks one
  // job may ask for (what this cluster could ever give it).
  int64_t max_spec_bytes = 256 * 1024;
  int64_t max_job_ranks = 16384;
  // A launch message larger than this is never sent (the transport would drop
  // the session); the job fails instead.
  int64_t max_launch_bytes = 16 * 1024 * 1024;
  // Finished jobs are forgotten (memory and store) this long after they end.
  absl::Duration finished_job_retention = absl::Hours(24 * 7);
  // A job's metric series are removed this long after it ends: long enough
  // for a few scrapes to see its final values.
  absl::Duration job_metrics_grace = absl::Seconds(60);
  // Streams watching one job; more are RESOURCE_EXHAUSTED (each holds a
  // queue and, until read, a snapshot with the job's backlog).
  int64_t max_watchers_per_job = 64;
  // Submissions waiting for the admission thread beyond this are refused.
  int64_t max_queued_submissions = 4096;
  // Pages of ListJobs.
  int32_t default_page_size = 100;
  int32_t max_page_size = 1000;
  // Where jobs may read data and keep checkpoints (--data_roots,
  // --checkpoint_root); empty data_roots: <state_dir>/data, empty
  // checkpoint_root: <state_dir>/checkpoints.
  FileRoots roots;
  // Job ids are job-<prefix>-<sequence>; empty prefix: job-<sequence>.
  std::string job_id_prefix;
};

// A job's placement, one entry per rank. Immutable once made (a new attempt
// gets a new one) and shared: the record, the persister and GetJob's full view
// hold the same one, so no reply or write copies 16,384 entries under the
// manager's lock (docs/scale.md).
using Placement = google::protobuf::RepeatedPtrField<loom::v1::RankPlacement>;

// One page of jobs, oldest first; next_page_token is empty on the last page.
struct JobPage {
  std::vector<loom::v1::Job> jobs;
  std::string next_page_token;
};

// What became of a batch of progress reports (JobManager::OnRankProgressBatch).
struct ProgressBatchResult {
  int32_t applied = 0;
  int32_t refused = 0;        // not this node's ranks in their jobs' current attempts
  int32_t stale = 0;          // of an earlier attempt of the job (draining after a restart)
  std::string first_refused;  // "job J attempt A rank R" of the first refused, for a log line
};

// Why an attempt ended early; each kind has its own restart budget.
enum class FailureKind { kCrash, kHang, kNodeLost, kJobBroken };

class JobManager {
 public:
  // Step reports each job keeps for watchers that join late (in memory: a
  // coordinator restart starts the backlog over from the stored last step).
  static constexpr size_t kWatchBacklogSteps = 10000;

  JobManager(JobManagerOptions options, std::unique_ptr<JobStore> store, NodeRegistry* nodes,
             KvStore* kv, CoordinatorMetrics* metrics, LayoutResolver resolver);
  // Stops the scheduler thread.
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Loads every stored job (after a coordinator restart).
  absl::Status Recover();

  using SubmitCallback = std::function<void(absl::StatusOr<loom::v1::Job>)>;
  // Queues a submission for the admission thread, which checks it, stores it
  // durably and then calls done (on that thread, without any lock held).
  // RESOURCE_EXHAUSTED at once when too many submissions wait. owner: the
  // caller's identity name (Job.owner).
  void SubmitAsync(std::string spec_yaml, std::string source_name, std::string base_dir,
                   std::string owner, SubmitCallback done);
  // base_dir (the client's spec directory) is not trusted and not used:
  // relative data paths resolve beneath the first data root.
  // SubmitAsync, waiting for the answer (tests, in-process callers).
  absl::StatusOr<loom::v1::Job> Submit(const std::string& spec_yaml, const std::string& source_name,
                                       const std::string& base_dir, const std::string& owner);
  // The job; with its placement only when view is JOB_VIEW_FULL (copied
  // after unlocking).
  absl::StatusOr<loom::v1::Job> Get(const std::string& id,
                                    loom::v1::JobView view = loom::v1::JOB_VIEW_BASIC) const;
  // A page of jobs without their specs, placements and histories (GetJob
  // has them): a reply stays small however many jobs or ranks there are.
  // visible, when given, filters the jobs (a caller sees only its own).
  absl::StatusOr<JobPage> List(int32_t page_size = 0, const std::string& page_token = "",
                               const std::function<bool(const loom::v1::Job&)>& visible = {}) const;
  absl::StatusOr<loom::v1::Job> Cancel(const std::string& id);
  // Forgets a job that has ended (memory, store, metrics); FAILED_PRECONDITION
  // while it still runs.
  absl::Status Delete(const std::string& id);
  // Subscribes; the sink immediately receives the snapshot with the steps
  // reported so far (up to kWatchBacklogSteps) as its backlog. Returns a
  // handle for Unwatch. A job already ended gets its snapshot as the last update.
  absl::StatusOr<int64_t> Watch(const std::string& id, std::shared_ptr<WatchSink> sink);
  void Unwatch(const std::string& id, int64_t handle);

  // Events from nodes and ranks.
  void OnNodeRegistered(const loom::v1::RegisterNode& registration);
  void OnNodeLost(const std::string& node_id,
                  const std::string& why = "its agent's session ended");
  // A lost node's session spoke again (a heartbeat after a stall): it is live
  // once more; ranks it still runs from attempts that moved on are killed.
  void OnNodeRevived(const std::string& node_id,
                     const std::vector<loom::v1::RunningRank>& running);
  void OnNodeHeartbeat(const std::string& node_id, const loom::v1::Heartbeat& heartbeat);
  // Ignored unless node_id runs that rank in the job's current attempt.
  void OnRankExited(const std::string& node_id, const loom::v1::RankExited& exit);
  // The progress reports of node_id's ranks, forwarded by its agent in one
  // message (one lock for the batch). A report counts only if its rank runs
  // on node_id in its job's current attempt; the others are refused.
  ProgressBatchResult OnRankProgressBatch(const std::string& node_id,
                                          const loom::v1::RankProgressBatch& batch);

  // Asks the scheduler thread to place pending jobs on free devices; called
  // after every event that may free or add devices. Returns at once.
  void Schedule();
  // Blocks until every scheduling request and message queued before the call
  // has been handled (tests).
  void WaitForScheduler();
  // Periodic: hung jobs, restart backoffs that expired, nodes that did not
  // come back after a coordinator restart.
  void CheckHealth(absl::Time now);
  // Every node known, with cordons and devices in use.
  std::vector<loom::v1::Node> ListNodes() const;
  // Lifts a node's cordon (NOT_FOUND, FAILED_PRECONDITION) and reschedules.
  absl::StatusOr<loom::v1::Node> Uncordon(const std::string& node_id);

 private:
  struct RankState {
    bool ready = false;
    bool exited = false;
    bool resumed = false;  // reported that its checkpoint load finished
    // When the rank sent its first report and its "resumed" (its own clock):
    // a recovery's rendezvous and checkpoint load end at the latest of them.
    absl::Time ready_at;
    absl::Time resumed_at;
    loom::v1::RankProgress last;
  };
  struct JobRecord {
    loom::v1::Job job;  // without placement: that is `placement` below
    std::shared_ptr<const Placement> placement = std::make_shared<const Placement>();
    spec::JobSpec spec;
    std::vector<RankState> ranks;
    size_t ranks_ready = 0;    // of ranks: counted, not scanned, on every report
    size_t ranks_resumed = 0;  // likewise
    size_t ranks_exited = 0;   // likewise, on every exit
    std::map<int64_t, std::shared_ptr<WatchSink>> watchers;
    absl::Time last_persist = absl::InfinitePast();
    std::map<std::string, int> node_failures;  // this job's failures per node
    std::unique_ptr<HangDetector> hang;  // of the current attempt
    absl::Time placed_at = absl::InfinitePast();  // of the current attempt (before a restart: past)
    std::deque<loom::v1::JobProgress> steps;  // every attempt's, oldest first, bounded
    int64_t sequence = 0;  // the number in the job's id: ListJobs pages by it
    double peak_flops = 0;  // sum over the current placement (for MFU)
    absl::Time drop_metrics_at = absl::InfiniteFuture();  // set when the job ends
    GoodputTracker goodput;  // the steps that counted
  };
  // What the scheduler copies out under the lock to place one job without it.
  struct PlacementSnapshot;
  struct PlacementResult;
  struct Admission {
    std::string spec_yaml;
    std::string source_name;
    std::string base_dir;
    std::string owner;
    SubmitCallback done;
  };

  // The checks of a submission that need no state (size, parse, rules,
  // limits, layout, memory); the spec with its layout resolved.
  absl::StatusOr<spec::JobSpec> CheckSubmission(const std::string& spec_yaml,
                                                const std::string& source_name,
                                                const std::string& base_dir) const;
  // The job's checkpoint directory from its owner and id, and the check that
  // checkpoint.resume_from names one of the owner's jobs.
  absl::Status AssignCheckpointDirLocked(const spec::JobSpec& spec, loom::v1::Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdmissionLoop();
  void AdmitBatch(std::vector<Admission>& batch);

  // What watchers receive of a job: no specs, placement or namespace, which
  // grow with the job and which no watcher reads.
  static loom::v1::Job WatchView(const loom::v1::Job& job);
  // Removes the metric series of jobs ended more than job_metrics_grace ago
  // and forgets jobs ended more than the retention ago (at most every 10 s).
  // Returns the jobs forgotten; the caller deletes them from the store
  // after unlocking.
  std::vector<std::string> SweepEndedJobsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One report of a rank already checked to run on its sender's node in the
  // job's current attempt: the rank's state, the job's progress and watchers.
  void ApplyProgressLocked(JobRecord& record, const loom::v1::RankProgress& progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TransitionLocked(JobRecord& record, loom::v1::JobState to, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the job's current record for the persister thread (the newest
  // record of a job wins): no database write, and no fsync, happens under mu_
  // or on a gRPC reaction. Callers that acknowledge a change to a client wait
  // for it with WaitPersisted after unlocking.
  void PersistLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns once everything queued before the call is in the store (durable).
  void WaitPersisted() ABSL_LOCKS_EXCLUDED(mu_);
  void PersisterLoop();
  void NotifyLocked(JobRecord& record, const loom::v1::WatchJobResponse& update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the scheduler thread; placement itself never runs under mu_.
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SchedulerLoop();
  // Places pending jobs first come, first served, until one does not fit.
  void RunSchedulingPass();
  // The first job waiting for placement that the cluster's devices (capacity,
  // by kind) could hold, copied with the devices taken by every other job;
  // false when none waits.
  bool SnapshotNextLocked(const std::map<std::string, int64_t>& capacity,
                          PlacementSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PlacementResult Place(const PlacementSnapshot& snapshot) const;
  // Records a placement computed without the lock, unless the job or its
  // nodes changed meanwhile (then false: the pass starts over).
  bool CommitLocked(const PlacementSnapshot& snapshot, PlacementResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Messages to agents are queued under mu_ and sent by the scheduler thread
  // after it unlocks, in the order they were queued.
  void QueueSendLocked(const std::string& node_id, loom::v1::CoordinatorMessage message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushOutbox();
  void ForgetLocked(const std::vector<std::string>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropJobMetricsLocked(const JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank failed (exit, signal, lost node): restart within budget, or fail.
  // rank: the one that failed or was blamed (-1: a whole node); cause: when
  // the failure happened (the start of the incident's detection phase).
  void HandleFailureLocked(JobRecord& record, FailureKind kind, const std::string& reason,
                           const std::string& node_id, int32_t rank = -1,
                           absl::Time cause = absl::InfiniteFuture())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a closed incident's measured phases in the recovery histogram.
  void ObserveIncidentLocked(const std::optional<loom::v1::RecoveryIncident>& incident)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An incident the last event completed: counted and persisted at once.
  void IncidentCompletedLocked(JobRecord& record,
                               const std::optional<loom::v1::RecoveryIncident>& incident)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KillRanksLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishAttemptLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateJobGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewJobIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static JobManagerOptions WithDefaultRoots(JobManagerOptions options);

  const JobManagerOptions options_;
  std::unique_ptr<JobStore> store_;
  NodeRegistry* nodes_;
  KvStore* kv_;
  CoordinatorMetrics* metrics_;
  LayoutResolver resolver_;

  mutable absl::Mutex mu_;
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // submission order
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_watch_handle_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time recovered_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Nodes that (re)registered and whose ranks are checked at their next heartbeat.
  std::map<std::string, absl::Time> unconfirmed_ ABSL_GUARDED_BY(mu_);

  bool schedule_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t requests_queued_ ABSL_GUARDED_BY(mu_) = 0;   // for WaitForScheduler
  int64_t requests_handled_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::pair<std::string, loom::v1::CoordinatorMessage>> outbox_ ABSL_GUARDED_BY(mu_);
  // A job waiting for the persister: its record and its placement, joined
  // into one stored Job on the persister thread.
  struct PendingWrite {
    loom::v1::Job job;
    std::shared_ptr<const Placement> placement;
  };
  std::map<std::string, PendingWrite> persist_pending_ ABSL_GUARDED_BY(mu_);
  int64_t persists_queued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t persists_done_ ABSL_GUARDED_BY(mu_) = 0;
  bool persister_stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_retention_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Mutex admission_mu_;
  std::deque<Admission> admissions_ ABSL_GUARDED_BY(admission_mu_);
  bool admission_stopping_ ABSL_GUARDED_BY(admission_mu_) = false;
  // Last: they start after every member above exists.
  std::thread scheduler_;
  std::thread admission_;
  std::thread persister_;
};

}  // namespace loom::coordinator
