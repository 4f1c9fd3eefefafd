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
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/health/hang_detector.h"
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

  // Loads every stored job (after a coordinator restart).
  absl::Status Recover();

  // owner: the caller's identity name (Job.owner).
  absl::StatusOr<loom::v1::Job> Submit(const std::string& spec_yaml, const std::string& source_name,
                                       const std::string& base_dir, const std::string& owner);
  absl::StatusOr<loom::v1::Job> Get(const std::string& id) const;
  std::vector<loom::v1::Job> List() const;
  absl::StatusOr<loom::v1::Job> Cancel(const std::string& id);
  // Subscribes; the sink immediately receives the snapshot with the steps
  // reported so far (up to kWatchBacklogSteps) as its backlog. Returns a
  // handle for Unwatch. A job already ended gets its snapshot as the last update.
  absl::StatusOr<int64_t> Watch(const std::string& id, std::shared_ptr<WatchSink> sink);
  void Unwatch(const std::string& id, int64_t handle);

  // Events from nodes and ranks.
  void OnNodeRegistered(const loom::v1::RegisterNode& registration);
  void OnNodeLost(const std::string& node_id);
  void OnNodeHeartbeat(const std::string& node_id, const loom::v1::Heartbeat& heartbeat);
  // Ignored unless node_id runs that rank in the job's current attempt.
  void OnRankExited(const std::string& node_id, const loom::v1::RankExited& exit);
  void OnRankProgress(const loom::v1::RankProgress& progress);

  // Places pending jobs on free devices; called after every event that may
  // free or add devices.
  void Schedule();
  // Periodic: hung jobs, restart backoffs that expired, nodes that did not
  // come back after a coordinator restart.
  void CheckHealth(absl::Time now);
  // Every node known, with cordons and devices in use.
  std::vector<loom::v1::Node> ListNodes() const;

 private:
  struct RankState {
    bool ready = false;
    bool exited = false;
    loom::v1::RankProgress last;
  };
  struct JobRecord {
    loom::v1::Job job;
    spec::JobSpec spec;
    std::vector<RankState> ranks;
    std::map<int64_t, std::shared_ptr<WatchSink>> watchers;
    absl::Time last_persist = absl::InfinitePast();
    std::map<std::string, int> node_failures;  // this job's failures per node
    std::unique_ptr<HangDetector> hang;  // of the current attempt
    absl::Time placed_at = absl::InfinitePast();  // of the current attempt (before a restart: past)
    std::deque<loom::v1::JobProgress> steps;  // every attempt's, oldest first, bounded
  };

  void TransitionLocked(JobRecord& record, loom::v1::JobState to, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyLocked(JobRecord& record, const loom::v1::WatchJobResponse& update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool TryPlaceLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank failed (exit, signal, lost node): restart within budget, or fail.
  void HandleFailureLocked(JobRecord& record, FailureKind kind, const std::string& reason,
                           const std::string& node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KillRanksLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishAttemptLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateJobGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewJobIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
};

}  // namespace loom::coordinator
