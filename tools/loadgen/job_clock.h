// The steps of loom-loadgen's simulated job, and the milestones of its
// attempts. The job is synchronous (data parallel): step s completes on every
// rank together, so a step is a function of time, shared by all ranks, not a
// counter each rank keeps (ranks whose node skipped a batch would drift apart
// and no step would be held by all of them, as no real job's ranks do).
//
// An attempt begins (its ranks launched, or the survivors moved to it by
// EnterEpoch) after its base step: 0 for a fresh start, the restore step in
// place. No step completes until every rank of it has resumed (an all-reduce
// waits for the last rank); from then on one step completes every `step`.
// A failure (a rank crashed or stopped, a node lost) freezes the clock: every
// other rank waits in the all-reduce of the next step until the next attempt.
//
// It also counts, per attempt, the ranks that resumed and the ranks that
// reported a step past the base ("past their next step"), with the times the
// last of them did: what a recovery is measured by.
//
// Pure: the time is a parameter; thread-safe (one mutex, taken once per node
// batch and once per rank milestone).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom::loadgen {

class JobClock {
 public:
  explicit JobClock(absl::Duration step = absl::Seconds(1)) : step_(step) {}

  // Attempt `attempt` of a job of `world_size` ranks begins after
  // `base_step`. Ignored unless newer than the current attempt (every rank of
  // an attempt calls it; the first wins).
  void BeginAttempt(int32_t attempt, int64_t base_step, int world_size, absl::Time now);

  // Rank `rank` of `attempt` resumed (restored its state, about to train).
  // The last rank of the current attempt to do so starts its steps.
  void Resumed(int32_t attempt, int rank, absl::Time now);
  // Rank `rank` of `attempt` reported a step past the attempt's base.
  void PastFirstStep(int32_t attempt, int rank, absl::Time now);

  // No step completes from `now` on (until the next attempt begins).
  void Freeze(absl::Time now);

  struct View {
    int32_t attempt = 0;  // the current attempt (0: none yet)
    int64_t base_step = 0;
    int64_t step = 0;       // the newest completed step
    bool stepping = false;  // every rank resumed, not frozen
    bool frozen = false;
    absl::Time frozen_since = absl::InfinitePast();
    int world_size = 0;
    int resumed = 0;          // ranks of the attempt that resumed
    int past_first_step = 0;  // ranks that reported a step past the base
    absl::Time all_resumed = absl::InfiniteFuture();
    absl::Time all_past_first_step = absl::InfiniteFuture();
    absl::Time began = absl::InfiniteFuture();  // BeginAttempt of this attempt
  };
  View At(absl::Time now) const;

 private:
  View ViewLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration step_;
  mutable absl::Mutex mu_;
  View view_ ABSL_GUARDED_BY(mu_);
  absl::Time stepping_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The step completed when the clock froze (steps stop there).
  int64_t frozen_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> resumed_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> past_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::loadgen
