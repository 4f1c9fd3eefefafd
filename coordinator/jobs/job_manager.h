// The job manager: the coordinator's jobs behind one front that the gRPC
// handlers call. It only wires the parts, each in its own file:
//
//   JobAdmission (thread)  --insert-->  JobPersister (thread)  --> JobStore
//        |                                 ^            | OnWritten
//        v                                 | records    v
//   JobTable (the one mutex: records, stored views, held effects, outbox)
//        ^        ^                  ^
//   JobLifecycle  JobScheduler       WatchHub (watchers, steps)
//   (events, restarts,  (thread: placement,
//    RecoveryPolicy)     sending)          JobMetrics (Prometheus)
//
// Threads: admission, scheduler and persister, plus the callers' (gRPC
// reactions, the liveness tick), which only take the table's mutex for
// memory work and never wait on the store: every change a caller must hear
// about is answered from the persister's completion.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/health/hang_detector.h"
#include "coordinator/jobs/job_admission.h"
#include "coordinator/jobs/job_lifecycle.h"
#include "coordinator/jobs/job_metrics.h"
#include "coordinator/jobs/job_paths.h"
#include "coordinator/jobs/job_persister.h"
#include "coordinator/jobs/job_scheduler.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/jobs/quota_book.h"
#include "coordinator/jobs/watch_hub.h"
#include "coordinator/rendezvous/kv_store.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

class CoordinatorMetrics;

struct JobManagerOptions {
  std::string state_dir;
  double kill_grace_seconds = 5;
  double collective_timeout_s = 60;
  // After a coordinator restart, nodes that ran a job's ranks get this long
  // to reconnect before they count as lost.
  absl::Duration recovery_grace = absl::Seconds(10);
  // A node silent this long is lost; also the agents' lease, which a lost
  // node's commit fence waits out (docs/fault_tolerance.md, "Fencing").
  absl::Duration node_timeout = absl::Seconds(5);
  HangPolicy hang_policy;  // fixed_timeout comes from each job's spec
  // A graceful stop (preemption, drain) kills what has not stopped by then.
  absl::Duration stop_grace = absl::Seconds(120);
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
  // The queue's rules and fair share's half-life (docs/scheduling.md).
  sched::PolicyOptions scheduling;
  double fair_share_half_life_s = 7 * 24 * 3600.0;
  // Quotas and priority caps (not owned; outlives the manager); null: none.
  const QuotaBook* quota_book = nullptr;
  // Retries of failed writes.
  JobPersisterOptions persister;
  // Called once (on the persister's thread) when a write was fenced: this
  // coordinator no longer leads and has stopped acting; the process should
  // end (crash-only, docs/ha.md).
  std::function<void(const absl::Status&)> on_fenced;
};

class JobManager {
 public:
  // Step reports each job keeps for watchers that join late (stored with
  // the job: a coordinator restart keeps them).
  static constexpr size_t kWatchBacklogSteps = WatchHub::kBacklogSteps;

  using JobCallback = std::function<void(absl::StatusOr<loom::v1::Job>)>;
  using StatusCallback = std::function<void(absl::Status)>;

  JobManager(JobManagerOptions options, std::unique_ptr<JobStore> store, NodeRegistry* nodes,
             KvStore* kv, CoordinatorMetrics* metrics, LayoutResolver resolver);
  ~JobManager();  // Stop()
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Loads every stored job and its steps (after a coordinator restart).
  absl::Status Recover();

  // Queues a submission for the admission thread, which checks it, stores it
  // and then calls done (on that thread, without any lock held).
  // RESOURCE_EXHAUSTED at once when too many submissions wait. owner: the
  // caller's identity name (Job.owner).
  void SubmitAsync(std::string spec_yaml, std::string source_name, std::string base_dir,
                   std::string owner, JobCallback done);
  // SubmitAsync, waiting for the answer (tests, in-process callers).
  absl::StatusOr<loom::v1::Job> Submit(const std::string& spec_yaml,
                                       const std::string& source_name,
                                       const std::string& base_dir, const std::string& owner);
  // The job as stored, with its live progress; with its placement only when
  // view is JOB_VIEW_FULL (copied after unlocking).
  absl::StatusOr<loom::v1::Job> Get(const std::string& id,
                                    loom::v1::JobView view = loom::v1::JOB_VIEW_BASIC) const;
  // A page of jobs without their specs, placements and histories (GetJob
  // has them): a reply stays small however many jobs or ranks there are.
  // visible, when given, filters the jobs (a caller sees only its own).
  absl::StatusOr<JobPage> List(int32_t page_size = 0, const std::string& page_token = "",
                               const std::function<bool(const loom::v1::Job&)>& visible = {}) const;
  // Cancels; done runs once the cancel is stored (UNAVAILABLE if it could
  // not be: then nothing changed).
  void CancelAsync(const std::string& id, JobCallback done);
  absl::StatusOr<loom::v1::Job> Cancel(const std::string& id);  // waits (tests)
  // Forgets a job that has ended (memory, store, steps, metrics) once the
  // store has deleted it; FAILED_PRECONDITION while it still runs.
  void DeleteAsync(const std::string& id, StatusCallback done);
  absl::Status Delete(const std::string& id);  // waits (tests)
  // Subscribes; the sink immediately receives the snapshot with the steps
  // reported so far (up to kWatchBacklogSteps) as its backlog. Returns a
  // handle for Unwatch. A job already ended gets its snapshot as the last update.
  absl::StatusOr<int64_t> Watch(const std::string& id, std::shared_ptr<WatchSink> sink);
  void Unwatch(const std::string& id, int64_t handle);

  // Events from nodes and ranks (job_lifecycle.h).
  void OnNodeRegistered(const loom::v1::RegisterNode& registration);
  void OnNodeLost(const std::string& node_id,
                  const std::string& why = "its agent's session ended");
  void OnNodeRevived(const std::string& node_id,
                     const std::vector<loom::v1::RunningRank>& running);
  void OnNodeHeartbeat(const std::string& node_id, const loom::v1::Heartbeat& heartbeat);
  void OnRankExited(const std::string& node_id, const loom::v1::RankExited& exit);
  ProgressBatchResult OnRankProgressBatch(const std::string& node_id,
                                          const loom::v1::RankProgressBatch& batch);

  // Asks the scheduler thread to place pending jobs on free devices; called
  // after every event that may free or add devices. Returns at once.
  void Schedule();
  // Returns once everything asked for before the call has been placed,
  // stored and sent (tests).
  void WaitIdle();
  // Periodic: hung jobs, restart backoffs that expired, nodes that did not
  // come back after a coordinator restart, ended jobs' metrics and
  // retention (their deletes go to the persister: this never waits on the
  // store).
  void CheckHealth(absl::Time now);
  // The waiting jobs in queue order with why each waits (the scheduler's last
  // pass); never waits on the job table.
  std::vector<QueueEntry> Queue() const { return scheduler_.Queue(); }
  // Every node known, with cordons and devices in use.
  std::vector<loom::v1::Node> ListNodes() const;
  // Lifts a node's cordon (NOT_FOUND, FAILED_PRECONDITION) and reschedules.
  absl::StatusOr<loom::v1::Node> Uncordon(const std::string& node_id);
  // Drains a node (loomctl drain, or its agent shutting down): cordoned, no
  // new work, and its jobs stopped gracefully to go on elsewhere.
  absl::StatusOr<loom::v1::Node> Drain(const std::string& node_id, const std::string& reason);

  // Whether it still acts on events (false once stopping or fenced).
  bool Acting() const;
  // A graceful stop (SIGTERM): acts on nothing more — events are ignored, so
  // the sessions that end with the server are not lost nodes — stores and
  // sends what was decided before, answers what waits, ends the threads.
  void Stop();
  // Another coordinator leads (a write of this one was fenced elsewhere, e.g.
  // the token list's): stop acting at once, as after a fenced job write —
  // nothing more is stored or sent, waiting callers hear why.
  void NoLongerLeading(const absl::Status& why);

  // The job table's invariants (tests).
  absl::Status CheckInvariants() const { return table_.CheckInvariants(); }

 private:
  static JobManagerOptions WithDefaultRoots(JobManagerOptions options);
  void ForgetLocked(const std::vector<std::string>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // Jobs past their metrics' grace lose their series; jobs past their
  // retention are deleted (at most every 10 s).
  void SweepEndedJobs(absl::Time now);
  void Fenced(const absl::Status& why);

  const JobManagerOptions options_;
  const std::unique_ptr<JobStore> store_;
  NodeRegistry* const nodes_;
  JobMetrics metrics_;
  WatchHub hub_;
  JobPersister persister_;
  JobTable table_;
  JobLifecycle lifecycle_;
  JobScheduler scheduler_;
  JobAdmission admission_;
  absl::Time last_sweep_ ABSL_GUARDED_BY(table_.mu()) = absl::InfinitePast();
  std::set<std::string> deleting_ ABSL_GUARDED_BY(table_.mu());  // retention deletes under way
  bool stopped_ = false;  // Stop ran (the caller's thread only)
};

}  // namespace loom::coordinator
