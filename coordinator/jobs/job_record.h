// What the coordinator holds of one job (JobRecord): its working record,
// the record the store last confirmed (what readers are shown), its placement
// and the state of each rank of the current attempt, an in-place recovery
// under way, and the effects and callers waiting for a change of it to be
// stored. Plain data: the job table (job_table.h) keeps the rules, the
// lifecycle (job_lifecycle.h) the recovery's.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "coordinator/health/hang_detector.h"
#include "coordinator/health/recovery_accounting.h"
#include "coordinator/health/straggler_detector.h"
#include "coordinator/jobs/in_place_policy.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::coordinator {

// A job's placement, one entry per rank. Immutable once made (a new attempt
// gets a new one) and shared: the record, the persister and GetJob's full view
// hold the same one, so no reply or write copies 16,384 entries under the
// table's lock (docs/scale.md).
using Placement = google::protobuf::RepeatedPtrField<loom::v1::RankPlacement>;

struct RankState {
  bool ready = false;
  bool exited = false;
  bool exit_ok = false;  // exited with code 0 (finished its steps)
  bool stopped = false;  // exited after a graceful stop, its step saved
  bool resumed = false;  // reported that its checkpoint load finished
  // When the rank sent its first report and its "resumed" (its own clock):
  // a recovery's rendezvous and checkpoint load end at the latest of them.
  absl::Time ready_at;
  absl::Time resumed_at;
  // Of its newest report, what the lifecycle reads: kept as numbers, so a
  // step report (one per rank per step) copies no message under the job lock.
  int64_t last_time_unix_ms = 0;
  int64_t memory_bytes = 0;
  // Its newest report when that is "aborted" (in place: the snapshots it
  // holds), kept whole; empty once it reports anything else.
  std::optional<loom::v1::RankProgress> aborted;
};

// An in-place recovery under way (docs/fault_tolerance.md, "In-place
// recovery"; job_lifecycle_in_place.cc). In memory only: what a restarted
// coordinator needs of it is in the job (RECOVERING, in_place_from_attempt,
// the commit fence, the incident).
struct InPlaceRecovery {
  enum class Phase {
    // RECOVERING, attempt n: the failed ranks are killed, the survivors told
    // to abort; their "aborted" reports and the killed ranks' exits are
    // awaited, until the abort deadline.
    kAborting,
    // All in, or the deadline passed: the scheduler decides (DecideInPlace)
    // and places attempt n+1, or the recovery falls back to the whole job.
    kDeciding,
    // Attempt n+1 is placed (EnterEpoch to the survivors' nodes, LaunchRank
    // for the relaunched ranks): RUNNING once every rank is ready in it.
    kRelaunched,
    // It fell back to the whole job (or the job ended) after attempt n+1 was
    // placed: survivors the EnterEpoch had not reached still run, and exit,
    // in from_attempt, and count as attempt n+1's ranks.
    kAbandoned,
    // RESTARTING, still attempt n: no room was left for the failed ranks
    // (InPlaceDecision::spill); the survivors write their snapshots of
    // spill_step as a checkpoint step and exit, or are killed at the
    // deadline. The whole job is placed again once every rank is gone.
    kSpilling,
  };
  Phase phase = Phase::kAborting;
  int32_t from_attempt = 0;  // n, the attempt that failed
  // What PlanRelaunch and DecideInPlace read: the failed attempt's placement,
  // what failed, the survivors' reports, the killed ranks still running.
  InPlaceRequest request;
  std::set<int64_t> failed;  // FailedRanks(request)
  std::string reason;        // the failure's first line, for AbortRanks
  absl::Time declared;
  absl::Time deadline = absl::InfiniteFuture();  // declared + abort_timeout_s
  absl::Duration backoff;  // before the whole job's next attempt, should it fall back
  // Relaunched: the ranks started again, and each survivors' node's
  // EnterEpoch (sent again when that node registers while its survivors
  // still run in from_attempt: the first may have been lost with a session).
  std::set<int64_t> relaunched;
  std::map<std::string, loom::v1::EnterEpoch> epochs;
  // Spilling: the order each survivor's node was sent (sent again when that
  // node registers while its survivors still run).
  loom::v1::StopRanks spill;
};

// A caller waiting for a change of a job to be stored: done gets OK and the
// stored record once the store has the change, or the failure after undo put
// the record back.
struct ChangeWaiter {
  int64_t version = 0;
  std::function<void(absl::Status, std::shared_ptr<const loom::v1::Job>)> done;
  std::function<void()> undo;
};

struct JobRecord {
  // Every change lands here first. Without placement (that is `placement`).
  loom::v1::Job job;
  // The newest record the store holds, without placement, and the placement
  // it holds: what GetJob, ListJobs and new watchers are shown.
  std::shared_ptr<const loom::v1::Job> stored;
  std::shared_ptr<const Placement> stored_placement = std::make_shared<const Placement>();
  std::shared_ptr<const Placement> placement = std::make_shared<const Placement>();
  spec::JobSpec spec;
  std::vector<RankState> ranks;  // of the current attempt, one per placed rank
  size_t ranks_ready = 0;    // of ranks: counted, not scanned, on every report
  size_t ranks_resumed = 0;  // likewise
  size_t ranks_exited = 0;   // likewise, on every exit
  std::map<std::string, int64_t> node_failures;  // this job's failures per node
  std::unique_ptr<HangDetector> hang;  // of the current attempt
  std::unique_ptr<StragglerDetector> straggler;  // likewise
  std::unique_ptr<InPlaceRecovery> in_place;  // while one is under way
  // When this coordinator placed the current attempt; InfinitePast when an
  // earlier coordinator did (the job came from the store).
  absl::Time placed_at = absl::InfinitePast();
  int64_t sequence = 0;  // the number in the job's id: ListJobs pages by it
  double peak_flops = 0;  // sum over the current placement (for MFU)
  // The planner's prediction of one step (planner::PredictStepSeconds), taken
  // once by the scheduler for jobs that promise no runtime; 0: none; -1: not
  // taken yet.
  double predicted_step_s = -1;
  absl::Time drop_metrics_at = absl::InfiniteFuture();  // set when the job ends
  absl::Time last_persist = absl::InfinitePast();
  GoodputTracker goodput;  // the steps that counted

  // Durability (job_table.h). A hard change (state, attempt, counters,
  // history) takes a new version; effects of it wait in `held` until the
  // store holds that version.
  int64_t version = 0;
  int64_t stored_version = 0;
  std::deque<std::pair<int64_t, std::function<void()>>> held;
  std::vector<ChangeWaiter> waiters;
};

}  // namespace loom::coordinator
