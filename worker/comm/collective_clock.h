// Where a rank's step time goes: how long it was blocked in the collectives
// of each of its groups, by operation kind, and when it arrived at them. One
// clock per rank attempt, shared by its timed groups (timed_communicator.h);
// the trainer starts a step on it and takes the step's summary with the
// progress report. Bounded: one entry per group and operation kind, never
// one per call (docs/observability.md).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loom::comm {

struct CollectiveSummary {
  std::string group;
  std::string op;
  int64_t calls = 0;
  absl::Duration blocked;        // summed over the calls
  absl::Duration first_arrival;  // after the step began
  absl::Duration last_arrival;
};

struct StepCollectives {
  absl::Duration elapsed;  // since BeginStep
  absl::Duration blocked;  // all groups together
  std::vector<CollectiveSummary> ops;  // by group, then operation
  // Time the process could not run at all (stall_watch.h), and the part of
  // it that fell while a collective blocked this rank: its peers waited for
  // a rank that was stopped, not for the network, so that part is the
  // rank's own time, not time blocked.
  absl::Duration stalled;
  absl::Duration stalled_while_blocked;
};

class CollectiveClock {
 public:
  // Starts a step at `now`: later arrivals are measured from it, and what was
  // recorded before is dropped.
  void BeginStep(absl::Time now);
  // One call: entered at `entered`, blocked its caller for `blocked`, moving
  // `bytes` of this rank's payload. Thread-safe (an asynchronous call's Wait
  // may run on another thread).
  void Record(const std::string& group, const char* op, absl::Time entered, absl::Duration blocked,
              int64_t bytes = 0);
  // Told of every call as it is recorded (`loomctl trace`'s recorder,
  // worker/trainer/step_trace.h), outside the clock's lock; set before the
  // groups are used, or null.
  using CallObserver = std::function<void(const std::string& group, const char* op,
                                          absl::Time entered, absl::Duration blocked,
                                          int64_t bytes)>;
  void set_observer(CallObserver observer);
  // The process could not run from `from` to `to` (stall_watch.h).
  void RecordStall(absl::Time from, absl::Time to);
  // What was recorded since BeginStep, as of `now`.
  StepCollectives Summary(absl::Time now = absl::Now()) const;

 private:
  // False when the call belongs to no step.
  bool RecordLocked(const std::string& group, const char* op, absl::Time entered,
                    absl::Duration blocked);

  mutable std::mutex mu_;
  absl::Time step_start_ = absl::InfinitePast();
  std::map<std::pair<std::string, std::string>, CollectiveSummary> ops_;
  // This step's blocked spans (adjacent or overlapping ones merged) and
  // stalls, bounded: beyond the bounds a stall's overlap is undercounted.
  using Span = std::pair<absl::Time, absl::Time>;
  std::vector<Span> blocked_spans_;
  std::vector<Span> stalls_;
  CallObserver observer_;
};

}  // namespace loom::comm
