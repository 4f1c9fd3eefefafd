// The scheduler: one thread that places jobs and sends every message to the
// agents. A placement pass takes the first waiting job (first come, first
// served; a job larger than every node known together waits without holding
// up the others) with the devices other jobs hold, under the job table's
// mutex; places it and builds every rank's assignment without the lock; and
// commits through the lifecycle only if nothing it read has changed. The
// messages the table releases (a launch once its attempt is stored, a kill)
// are sent from here after unlocking, in the order they were queued, so a
// large job's placement never stalls other calls, heartbeats included.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"
#include "coordinator/cluster/node_registry.h"
#include "coordinator/jobs/job_lifecycle.h"
#include "coordinator/jobs/job_paths.h"
#include "coordinator/jobs/job_table.h"
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
    spec::JobSpec spec;
    std::string resolved_spec_yaml;
    std::string owner;
    std::string checkpoint_dir;  // Job.checkpoint_dir: <checkpoint_root>/<owner>/<id>
    std::set<std::string> avoid;                     // nodes that failed this job
    std::map<std::string, std::set<int32_t>> taken;  // devices other jobs hold, by node
  };
  struct Result {
    bool fits = false;
    absl::Status error;  // the job can never be placed as specified: it fails
    PlacedAttempt attempt;
    std::set<std::string> nodes;
  };
  // The first job waiting for placement that the cluster's devices
  // (capacity, by kind) could hold; false when none waits.
  bool SnapshotNextLocked(const std::map<std::string, int64_t>& capacity, Snapshot& snapshot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  // Places the snapshot's job on the live nodes' free devices (no lock).
  Result Place(const Snapshot& snapshot) const;

 private:
  void Loop();
  // Places pending jobs first come, first served, until one does not fit.
  void RunPass();
  // Records a placement computed without the lock, unless the job or its
  // nodes changed meanwhile (then false: the pass starts over).
  bool CommitLocked(const Snapshot& snapshot, Result& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());
  void Flush();

  const SchedulerOptions options_;
  JobTable* const table_;
  JobLifecycle* const lifecycle_;
  NodeRegistry* const nodes_;
  bool stopping_ ABSL_GUARDED_BY(table_->mu()) = false;
  int64_t handled_ ABSL_GUARDED_BY(table_->mu()) = 0;  // schedule requests handled
  std::thread thread_;
};

}  // namespace loom::coordinator
