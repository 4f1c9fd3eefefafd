// `loomctl trace` on one rank (docs/observability.md, "Traces"): records
// what one step did, as spans on tracks: "compute" carries the training
// loop's phases (TrainingLoop::PhaseListener: load_data, forward and backward
// per micro-batch and chunk, reduce_gradients, optimizer, snapshot,
// checkpoint), and each communicator group has a track of its own with every
// collective call (operation, bytes, time blocked; CollectiveClock's
// observer). The trainer begins each step on it and takes the trace with that
// step's report, which carries it to the coordinator.
//
// Bounded: at most kMaxTraceEvents events and about kMaxTraceBytes encoded
// (a progress report may be 64 KiB); later events are dropped and counted.
// Outside the step asked for, a call costs one atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/v1/rank.pb.h"

namespace loom::trainer {

inline constexpr int kMaxTraceEvents = 1024;
inline constexpr int64_t kMaxTraceBytes = 40 * 1024;
inline constexpr int kMaxTraceTracks = 16;  // compute and one per group
inline constexpr int kMaxTraceNames = 64;   // phases and operations
inline constexpr char kComputeTrack[] = "compute";

class StepTraceRecorder {
 public:
  // Step `step` begins at `now`; it is recorded when `record` (the step was
  // asked for), and whatever an earlier step left is dropped.
  void BeginStep(int64_t step, bool record, absl::Time now);
  // The loop entered `phase` (the compute track): the phase before it ends.
  void Phase(const char* phase, int64_t micro_batch, int64_t chunk, absl::Time now);
  // One collective call on `group`, entered at `entered` and done at `now`,
  // blocked for `blocked` of that.
  void Collective(const std::string& group, const char* op, absl::Time entered,
                  absl::Duration blocked, int64_t bytes, absl::Time now);
  // Whether a step is being recorded: callers check it before reading the
  // clock for the calls above (a clock read costs more than this load).
  bool recording() const { return recording_.load(std::memory_order_acquire); }
  // The trace of `step` if it was recorded (its last phase ends at `now`);
  // recording stops either way.
  std::optional<loom::v1::StepTrace> Finish(int64_t step, absl::Time now);

 private:
  struct OpenPhase {
    int name = -1;  // none open
    int64_t micro_batch = -1;
    int64_t chunk = 0;
    absl::Time since;
  };
  int IndexLocked(std::map<std::string, int>& index, const std::string& value,
                  google::protobuf::RepeatedPtrField<std::string>* values, int max)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddLocked(int track, int name, absl::Time start, absl::Time end, int64_t bytes,
                 absl::Duration blocked, int64_t micro_batch, int64_t chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClosePhaseLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<bool> recording_{false};
  absl::Mutex mu_;
  absl::Time start_ ABSL_GUARDED_BY(mu_);
  loom::v1::StepTrace trace_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> tracks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> names_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;  // the trace's encoded size, about
  OpenPhase open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::trainer
