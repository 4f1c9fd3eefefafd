// What the coordinator holds of one job (JobRecord): its working record,
// the record the store last confirmed (what readers are shown), its placement
// and the state of each rank of the current attempt, and the effects and
// callers waiting for a change of it to be stored. Plain data: the job table
// (job_table.h) keeps the rules.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "coordinator/health/hang_detector.h"
#include "coordinator/health/recovery_accounting.h"
#include "loom/v1/job.pb.h"

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
  bool resumed = false;  // reported that its checkpoint load finished
  // When the rank sent its first report and its "resumed" (its own clock):
  // a recovery's rendezvous and checkpoint load end at the latest of them.
  absl::Time ready_at;
  absl::Time resumed_at;
  loom::v1::RankProgress last;
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
  // When this coordinator placed the current attempt; InfinitePast when an
  // earlier coordinator did (the job came from the store).
  absl::Time placed_at = absl::InfinitePast();
  int64_t sequence = 0;  // the number in the job's id: ListJobs pages by it
  double peak_flops = 0;  // sum over the current placement (for MFU)
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
