// Recovery, accounted: the phases of each failure's recovery and the job's
// goodput. Pure: fed with events and the times they happened at, it keeps the
// incidents in the job (loom.v1.Job.incidents) and says how long each phase
// took. JobManager calls it; docs/fault_tolerance.md describes the phases.
//
// An incident's phases lie between consecutive boundaries on the
// coordinator's clock:
//   cause -> declared        detection  (exit / last progress / last heartbeat)
//   declared -> stopped      stopping   (kills sent -> every rank's exit seen)
//   stopped -> placed        placement  (restart backoff, waiting for devices)
//   placed -> ready          rendezvous (every rank joined)
//   ready -> resumed         checkpoint load (every rank finished loading)
//   resumed -> first step    first step (the new attempt's first step done)
// so the phases sum to the whole recovery, cause -> first step. The last
// three are the ranks' own times (their reports arrive in any order across
// ranks, and late under load); a boundary earlier than one before it (clock
// skew between machines) counts as that one.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "loom/v1/job.pb.h"

namespace loom::coordinator {

inline constexpr int kRecoveryPhaseCount = 6;
// Prometheus label values and loomctl's column names, in timeline order.
inline constexpr std::array<const char*, kRecoveryPhaseCount> kRecoveryPhaseNames = {
    "detection", "stopping", "placement", "rendezvous", "checkpoint_load", "first_step"};
// The incidents a job keeps (oldest dropped first), so a job that fails
// often does not grow without bound.
inline constexpr int kMaxIncidents = 32;

// Opens an incident for a failure the coordinator declares at `declared`
// whose cause happened at `cause` (a cause after the declaration counts as the
// declaration). An incident still open is closed first, cut short, and
// returned so that its measured phases can still be counted.
std::optional<loom::v1::RecoveryIncident> OpenIncident(loom::v1::Job& job, const std::string& kind,
                                                       int32_t rank, const std::string& node_id,
                                                       const std::string& reason, absl::Time cause,
                                                       absl::Time declared);

// The open incident's boundaries, each set once, in any order. When the last
// of them is set the incident is complete: closed and returned. No open
// incident: nothing happens.
std::optional<loom::v1::RecoveryIncident> MarkStopped(loom::v1::Job& job, absl::Time at);
std::optional<loom::v1::RecoveryIncident> MarkPlaced(loom::v1::Job& job, absl::Time at);
std::optional<loom::v1::RecoveryIncident> MarkReady(loom::v1::Job& job, absl::Time at);
std::optional<loom::v1::RecoveryIncident> MarkResumed(loom::v1::Job& job, absl::Time at);
// The new attempt's first step, after resumed_step (the step it resumed after).
std::optional<loom::v1::RecoveryIncident> MarkFirstStep(loom::v1::Job& job, absl::Time at,
                                                        int64_t resumed_step);
// The job ended (or gave up) while an incident was open: it is closed
// incomplete and returned.
std::optional<loom::v1::RecoveryIncident> CloseIncident(loom::v1::Job& job, absl::Time at);

// The phases an incident measured (both boundaries reached), as
// (index into kRecoveryPhaseNames, seconds).
std::vector<std::pair<int, double>> MeasuredPhases(const loom::v1::RecoveryIncident& incident);

// Goodput: the fraction of the wall time since the job first ran that went
// into steps that counted. It remembers the durations of the last max_steps
// steps so that the steps a restart redoes (the new attempt resumes from an
// older checkpoint) are taken back out of the counted time. In memory only:
// after a coordinator restart steps from before it cannot be taken back.
class GoodputTracker {
 public:
  explicit GoodputTracker(size_t max_steps = 10000) : max_steps_(max_steps) {}
  // The job ran for the first time (RUNNING); later calls change nothing.
  static void Started(loom::v1::Job& job, absl::Time at);
  // A step completed: steps at or after it counted earlier were redone.
  void OnStep(loom::v1::Job& job, int64_t step, double seconds);
  // Sets job.goodput for the wall time up to `now` and returns it (0 before
  // the job first ran).
  static double Update(loom::v1::Job& job, absl::Time now);

 private:
  size_t max_steps_;
  std::deque<std::pair<int64_t, double>> steps_;  // (step, seconds), in order
};

}  // namespace loom::coordinator
