// The lifecycle of a placed job: its ranks' progress (ready, RUNNING, steps,
// the job's progress and its watchers; job_progress.cc), their exits, nodes
// lost, registered and revived (job_lifecycle_nodes.cc), hangs, cancels, and
// what a failure leads to.
// The recovery policy (recovery_policy.h, pure) decides from the job's record
// alone whether the job fails or recovers, on which of two paths, and
// whether a node is cordoned; this part carries the decision out — the whole
// job restart (every rank stopped, attempt n+1 placed after a backoff from
// the newest checkpoint), or in-place recovery (RECOVERING: the failed ranks
// killed, the survivors aborted, their reports collected; the scheduler
// decides and places attempt n+1 with only the failed ranks relaunched;
// RUNNING once every rank joined it; job_lifecycle_in_place.cc). A
// coordinator that restarted finishes the recoveries it finds: it counts the
// exits of a restarting attempt again from the agents' registrations and
// sends again the kills that its ranks still need, and an in-place recovery
// whose next attempt was stored goes on (one that had not got that far
// restarts whole); a coordinator that stops (SIGTERM, leadership lost)
// reacts to nothing more, so its ending sessions are never taken for failed
// nodes. Nodes that register or heartbeat with ranks their lease paused get
// those still current resumed (ResumeRanks) and the others killed. Every
// method runs under the job table's mutex (taking it, or requiring it) and
// never waits on anything else: messages to agents and watchers' updates
// queue, and wait for the store.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/health/hang_detector.h"
#include "coordinator/jobs/elastic_policy.h"
#include "coordinator/jobs/in_place_policy.h"
#include "coordinator/jobs/job_metrics.h"
#include "coordinator/jobs/job_record.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/jobs/recovery_policy.h"
#include "coordinator/jobs/watch_hub.h"
#include "coordinator/rendezvous/kv_store.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator {

struct LifecycleOptions {
  // SIGTERM to SIGKILL, when ranks are stopped.
  double kill_grace_seconds = 5;
  // After a coordinator restart, nodes that ran a job's ranks get this long
  // to reconnect before they count as lost.
  absl::Duration recovery_grace = absl::Seconds(10);
  HangPolicy hang_policy;  // fixed_timeout comes from each job's spec
  StragglerPolicy straggler_policy;  // docs/observability.md
  // The node timeout, which is also the agents' lease: a lost node's ranks
  // may act until its last heartbeat plus this (the commit fence).
  absl::Duration node_timeout = absl::Seconds(5);
  // A graceful stop's deadline: ranks still running then are killed.
  absl::Duration stop_grace = absl::Seconds(120);
  // A job's metric series are removed this long after it ends.
  absl::Duration job_metrics_grace = absl::Seconds(60);
};

// What became of a batch of progress reports (OnRankProgressBatch).
struct ProgressBatchResult {
  int32_t applied = 0;
  int32_t refused = 0;        // not this node's ranks in their jobs' current attempts
  int32_t stale = 0;          // of an earlier attempt of the job (draining after a restart)
  std::string first_refused;  // "job J attempt A rank R" of the first refused, for a log line
};

// A placement the scheduler computed for a job's next attempt.
struct PlacedAttempt {
  std::string store_namespace;
  std::vector<loom::v1::RankAssignment> assignments;
  std::shared_ptr<const Placement> placement;
  double peak_flops = 0;  // summed over the placement (for MFU)
  std::string nodes_text;  // "node-a (ranks 0-3), ..." for the history
  // In place: each survivors' node's EnterEpoch (in_place_messages.h).
  std::map<std::string, loom::v1::EnterEpoch> epochs;
  // The job's own spares (resources.spares) held with this attempt.
  std::vector<loom::v1::RankPlacement> spares;
};

// The commit fence a job's current namespace is opened with (the one kept
// in the job: Job.commit_fence_until_unix_ms); none when it has passed.
CommitFence CommitFenceOf(const loom::v1::Job& job);

class JobLifecycle {
 public:
  using JobCallback = std::function<void(absl::StatusOr<loom::v1::Job>)>;

  JobLifecycle(LifecycleOptions options, JobTable* table, WatchHub* hub, JobMetrics* metrics,
               NodeRegistry* nodes, KvStore* kv);

  // Events from nodes and ranks.
  // The progress reports of node_id's ranks (one lock for the batch). A
  // report counts only if its rank runs on node_id in its job's current
  // attempt; the others are refused.
  ProgressBatchResult OnRankProgressBatch(const std::string& node_id,
                                          const loom::v1::RankProgressBatch& batch);
  // Ignored unless node_id runs that rank in the job's current attempt.
  void OnRankExited(const std::string& node_id, const loom::v1::RankExited& exit);
  void OnNodeLost(const std::string& node_id, const std::string& why);
  // A node (re)registered: ranks it runs of attempts that moved on are
  // killed; a restarting attempt counts the ranks it no longer runs as
  // exited and has the others killed (again).
  void OnNodeRegistered(const loom::v1::RegisterNode& registration);
  // A lost node's session spoke again: live once more; ranks it still runs
  // from attempts that moved on are killed.
  void OnNodeRevived(const std::string& node_id,
                     const std::vector<loom::v1::RunningRank>& running);
  // The first heartbeat after a registration: placed ranks the node neither
  // runs nor reported are handled as crashed.
  void OnNodeHeartbeat(const std::string& node_id, const loom::v1::Heartbeat& heartbeat);
  // Periodic: hung jobs, restart backoffs that expired, nodes that did not
  // come back after a coordinator restart.
  void CheckHealth(absl::Time now);

  // Graceful stops (job_lifecycle_stop.cc). Tells a RUNNING or STARTING job
  // to stop after its next step, saving it (StopRanks to its nodes); it is
  // PREEMPTED once its ranks are gone. False when it was told already or
  // does not run.
  bool StopGracefullyLocked(JobRecord& record, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A job that came back to RUNNING in place with ranks on a drained node
  // (drained while it recovered) stops gracefully too.
  void StopIfOnDrainedNodeLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Every job with ranks on the node stops gracefully; returns how many.
  int DrainNodeLocked(const std::string& node_id, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());

  // Cancels a job; done runs once the change is stored (on the persister's
  // thread), or with UNAVAILABLE when it could not be (then nothing changed).
  void Cancel(const std::string& id, JobCallback done);

  // For the scheduler: a placement committed (attempt n+1 starts; its
  // launches leave once it is stored), or a job that can never be placed as
  // specified fails.
  void StartAttemptLocked(JobRecord& record, PlacedAttempt attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  void FailUnplaceableLocked(JobRecord& record, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Elastic jobs (job_lifecycle_elastic.cc): the scheduler placed the job at
  // another size; its spec, layout and history say so before the attempt.
  void ResizeLocked(JobRecord& record, const ElasticDecision& resize)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A job the scheduler could not place says why in its history, once per
  // reason (an elastic job below fault_tolerance.min_ranks).
  void NoteWaitingLocked(const std::string& job_id, int32_t attempt, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A RUNNING elastic job below its requested size grows back when devices
  // are free and the minimum time since its last resize has passed: its
  // ranks stop and the whole job is placed again, at the larger size
  // (job_scheduler_elastic.cc), from its newest checkpoint. True when it did.
  bool CheckGrowLocked(JobRecord& record, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // The ranks the job asked for (its spec as submitted); its spec's when
  // that cannot be read.
  static int64_t RequestedRanks(const JobRecord& record);
  // The job's own spares: held from a placement (`spares`); a spare device a
  // relaunched rank took is no longer one.
  static void HoldSpares(loom::v1::Job& job, const std::vector<loom::v1::RankPlacement>& spares);
  static void DropUsedSpares(loom::v1::Job& job, const Placement& placement);
  // For the scheduler, an in-place recovery whose survivors have all
  // reported (or whose abort deadline passed): the request to decide it on,
  // with the live nodes' free devices of now; nullopt for any other job.
  std::optional<InPlaceRequest> RelaunchRequestLocked(const JobRecord& record) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Whether the record's in-place recovery waits for that decision.
  static bool AwaitsRelaunch(const JobRecord& record);
  // Whether the record's survivors are writing their snapshots (a spill,
  // SpillLocked) and its deadline has not passed.
  static bool SpillUnderWay(const JobRecord& record);
  // The scheduler decided it in place and built attempt n+1: stored, then
  // EnterEpoch to the survivors' nodes and LaunchRank for the relaunched
  // ranks only.
  void RelaunchInPlaceLocked(JobRecord& record, PlacedAttempt attempt,
                             const InPlaceDecision& decision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // An in-place recovery cannot go on: the whole job restarts (the restart
  // was counted when the recovery began), with why in its incident.
  void FallBackLocked(JobRecord& record, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // No room for the failed ranks of a job that may shrink (the decision's
  // spill): the whole job restarts as FallBackLocked's does, but the
  // survivors are first told to write their snapshots of the decision's
  // restore step as a checkpoint step (StopRanks.spill_step) and to exit;
  // those still running after --stop_grace_s are killed.
  void SpillLocked(JobRecord& record, const InPlaceDecision& decision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A job loaded from the store at start: its namespace (with its commit
  // fence), its hang watch, the grace its nodes get, and a recovery in place
  // it was in the middle of (finished when its next attempt was stored: the
  // ranks that report in it make it RUNNING, one missing is a failure and the
  // whole job restarts; restarted whole when it was not).
  void RecoveredLocked(JobRecord& record, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());

  void UpdateJobGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());

 private:
  // The state machine (table) and what follows a transition: the job's end
  // (its incident closed, goodput, metrics' grace), the watchers' event once
  // it is stored, the gauges.
  bool TransitionLocked(JobRecord& record, loom::v1::JobState to, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // To the job's watchers once what they are told is stored.
  void NotifyLocked(JobRecord& record, loom::v1::WatchJobResponse update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // One report of a rank already checked to run on its sender's node in the
  // job's current attempt.
  void ApplyProgressLocked(JobRecord& record, const loom::v1::RankProgress& progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A step report's timing (job_stragglers.cc): scored against the rank's
  // peers; a rank flagged or cleared is recorded, named in the job, and with
  // fault_tolerance.straggler: replace moved off its node (then true: the
  // attempt is being replaced, the report says nothing more).
  bool ObserveTimingLocked(JobRecord& record, const loom::v1::RankProgress& progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A new attempt's detectors: hangs and stragglers, nothing flagged yet.
  void WatchAttemptLocked(JobRecord& record, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A rank of the current attempt is gone; false when it already was.
  bool MarkExitedLocked(JobRecord& record, int32_t rank, bool ok)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A failure was declared: the policy decides, this carries it out.
  void HandleFailureLocked(JobRecord& record, const Failure& failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // An exit that is part of a graceful stop (kExitStopped; any other while
  // one is under way): counted, and the job PREEMPTED once all are gone.
  // False when the exit is none of this.
  bool StoppedExitLocked(JobRecord& record, const std::string& node_id,
                         const loom::v1::RankExited& exit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A failure while the job stops ends the stop (the ranks are killed); true
  // when the job was stopping.
  bool StopInsteadOfRecoveringLocked(JobRecord& record, const Failure& failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  void FinishStopIfDoneLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A job's StopRanks, for each of its nodes.
  static loom::v1::CoordinatorMessage StopMessage(const loom::v1::Job& job);
  // A node (re)registered: the stops its old session may have lost, again.
  void ResendStopsLocked(const std::string& node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Once per stop: why, in the history, and the ranks still running killed.
  void EndStopEarlyLocked(JobRecord& record, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Ranks that did not stop by the deadline are killed.
  void CheckStopDeadlineLocked(JobRecord& record, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // The whole-job path: restart counted, incident opened, RESTARTING, kills.
  void RestartWholeJobLocked(JobRecord& record, const Failure& failure,
                             const RecoveryDecision& decision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());

  // The in-place path (job_lifecycle_in_place.cc).
  // What PlanRelaunch needs of the record and the cluster for this failure.
  InPlaceRequest InPlaceRequestLocked(const JobRecord& record, const Failure& failure) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // The live, connected nodes of the job's device kind, each with the local
  // devices no other job holds.
  std::vector<RelaunchNode> RelaunchNodesLocked(const JobRecord& record) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Restart counted, incident opened on the in-place path, RECOVERING; once
  // stored, KillRanks for the failed ranks still running and AbortRanks to
  // the survivors' nodes.
  void RecoverInPlaceLocked(JobRecord& record, const Failure& failure,
                            const RecoveryDecision& decision, InPlaceRequest request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A survivor's "aborted" report of the failed attempt.
  void OnAbortedLocked(JobRecord& record, const loom::v1::RankProgress& progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Every survivor reported and every killed rank exited, or the deadline
  // passed: the scheduler decides.
  void CheckAbortsLocked(JobRecord& record, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A spill past its deadline: the survivors still running are killed.
  void CheckSpillDeadlineLocked(JobRecord& record, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // An exit while an in-place recovery is under way that is part of it (a
  // killed failed rank; a survivor the EnterEpoch had not reached, reported
  // in from_attempt: *counts_as_current set, for the caller to count it as
  // that rank's exit in the current attempt). Returns true when the exit was
  // handled here.
  bool InPlaceExitLocked(JobRecord& record, const std::string& node_id,
                         const loom::v1::RankExited& exit, bool* counts_as_current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // The commit fence of a lost node (until its lease has surely run out),
  // kept in the job with the later of it and any earlier one.
  void FenceForLostNodeLocked(loom::v1::Job& job, const Failure& failure) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());

  // What a rank a node lists (job, attempt, rank) is to its job.
  enum class Listed {
    kCurrent,        // the node runs it in the job's current attempt
    kAwaitingEpoch,  // a survivor still in from_attempt: EnterEpoch has not reached it
    kStale,          // of an attempt that moved on, an ended job, another node
  };
  Listed ClassifyLocked(const std::string& node_id, const loom::v1::RunningRank& rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // A node (re)registered while an in-place recovery had a message for it
  // (AbortRanks, EnterEpoch) that its old session may have lost: sent again.
  void ResendInPlaceLocked(const std::string& node_id,
                           const google::protobuf::RepeatedPtrField<loom::v1::RunningRank>& running)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Ranks its lease paused that are still current are resumed (ResumeRanks);
  // the others are killed.
  void ResumePausedLocked(const std::string& node_id,
                          const google::protobuf::RepeatedPtrField<loom::v1::RunningRank>& running)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Ranks that exited while nothing acted on their exits (a cancel that was
  // then put back): the job ends or fails as their exits say.
  void ReconcileExitsLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Kills of every rank of the current attempt, once the change is stored.
  void KillRanksLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Kills of the ranks node_id runs that are not of their jobs' current
  // attempts on that node (now: they are known to be stale).
  void KillStaleLocked(const std::string& node_id,
                       const google::protobuf::RepeatedPtrField<loom::v1::RunningRank>& running)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Every rank of the attempt is gone: its namespace goes once that is stored.
  void FinishAttemptLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // An incident the last event completed: counted and persisted.
  void IncidentCompletedLocked(JobRecord& record,
                               const std::optional<loom::v1::RecoveryIncident>& incident)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  loom::v1::CoordinatorMessage KillMessage(const std::string& job_id, int32_t attempt) const;
  // The kill of every rank the job's current attempt may have on a node:
  // every attempt of the job after an in-place relaunch (survivors the
  // EnterEpoch did not reach still run in the one before).
  loom::v1::CoordinatorMessage KillAllMessage(const JobRecord& record) const;
  std::unique_ptr<HangDetector> NewHangDetector(const JobRecord& record, absl::Time now) const;

  const LifecycleOptions options_;
  JobTable* const table_;
  WatchHub* const hub_;
  JobMetrics* const metrics_;
  NodeRegistry* const nodes_;
  KvStore* const kv_;
  // When this coordinator loaded jobs whose ranks may run; InfinitePast once
  // their nodes' grace is over.
  absl::Time recovered_at_ ABSL_GUARDED_BY(table_->mu()) = absl::InfinitePast();
  // Nodes that (re)registered and whose ranks are checked at their next heartbeat.
  std::map<std::string, absl::Time> unconfirmed_ ABSL_GUARDED_BY(table_->mu());
};

}  // namespace loom::coordinator
