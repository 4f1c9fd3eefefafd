// Recovery, accounted: the phases of each failure's recovery and the job's
// goodput. Pure: fed with events and the times they happened at, it keeps the
// incidents in the job (loom.v1.Job.incidents) and says how long each phase
// took. JobManager calls it; docs/fault_tolerance.md describes the phases.
//
// An incident recovers on one of two paths (RecoveryIncident.path), each a
// timeline of boundaries; its phases lie between consecutive ones:
//
//   whole_job (every rank restarted)      in_place (survivors kept)
//   cause -> declared     detection       cause -> declared     detection
//   declared -> stopped   stopping        declared -> aborted   abort
//   stopped -> placed     placement       aborted -> placed     relaunch
//   placed -> ready       rendezvous      placed -> ready       rendezvous
//   ready -> resumed      checkpoint load ready -> resumed      restore
//   resumed -> first step first step      resumed -> first step first step
//
// so the phases sum to the whole recovery, cause -> first step. An incident
// opens on the whole-job path; MarkInPlace moves it to the in-place one and
// MarkWholeJob back (a fallback: the abort's time then counts in stopping).
// The last three boundaries are the ranks' own times (their reports arrive
// in any order across ranks, and late under load); a boundary earlier than
// one before it (clock skew between machines) counts as that one. The
// in-place path keeps its restore in the checkpoint_load field.
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

// The phases of one incident, on either path.
inline constexpr int kRecoveryPhaseCount = 6;
// Prometheus label values (loom_recovery_phase_seconds{phase}): the whole-job
// path's phases in timeline order, then the three the in-place path has of
// its own (it shares detection, rendezvous and first_step).
inline constexpr int kRecoveryPhaseNameCount = 9;
inline constexpr std::array<const char*, kRecoveryPhaseNameCount> kRecoveryPhaseNames = {
    "detection",  "stopping", "placement", "rendezvous", "checkpoint_load",
    "first_step", "abort",    "relaunch",  "restore"};
// RecoveryIncident.path values.
inline constexpr char kPathWholeJob[] = "whole_job";
inline constexpr char kPathInPlace[] = "in_place";
// Relaunched ranks an incident lists (a lost node's are a handful; a failure
// of more ranks than this is one a whole-job restart covers anyway).
inline constexpr int kMaxRelaunchedRanksKept = 1024;
// The incidents a job keeps (oldest dropped first), so a job that fails
// often does not grow without bound.
inline constexpr int kMaxIncidents = 32;

// Opens an incident for a failure the coordinator declares at `declared`
// whose cause happened at `cause` (a cause after the declaration counts as the
// declaration), on the whole-job path, noting the newest step the job had
// reported (Job.last_progress.step; every later event raises it with reports
// of the failed attempt that arrive late) for the steps recomputed. An incident
// still open is closed first, cut short, and returned so that its measured
// phases can still be counted.
std::optional<loom::v1::RecoveryIncident> OpenIncident(loom::v1::Job& job, const std::string& kind,
                                                       int32_t rank, const std::string& node_id,
                                                       const std::string& reason, absl::Time cause,
                                                       absl::Time declared);

// The open incident recovers in place, relaunching these ranks (the job goes
// RECOVERING). Its path's boundaries become cause, declared, aborted, placed...
std::optional<loom::v1::RecoveryIncident> MarkInPlace(loom::v1::Job& job,
                                                      const std::vector<int64_t>& relaunched);
// The open incident falls back to (or stays on) the whole-job path, for this
// reason (empty: the whole job was the plan; else in_place was off, a second
// failure, an abort past its deadline, no common snapshot step...).
std::optional<loom::v1::RecoveryIncident> MarkWholeJob(loom::v1::Job& job,
                                                       const std::string& fallback_reason);
// In place: the restore step was chosen; newest_step is the newest step any
// rank reported. Sets resumed_step and steps_recomputed (= newest - restore)
// before the first step confirms them.
void MarkRestoreStep(loom::v1::Job& job, int64_t restore_step, int64_t newest_step);

// The open incident's boundaries, each set once, in any order. When the last
// of its path's boundaries is set the incident is complete: closed and
// returned. No open incident: nothing happens.
// Aborted: every survivor left its collectives and reported its snapshots.
std::optional<loom::v1::RecoveryIncident> MarkAborted(loom::v1::Job& job, absl::Time at);
std::optional<loom::v1::RecoveryIncident> MarkStopped(loom::v1::Job& job, absl::Time at);
std::optional<loom::v1::RecoveryIncident> MarkPlaced(loom::v1::Job& job, absl::Time at);
std::optional<loom::v1::RecoveryIncident> MarkReady(loom::v1::Job& job, absl::Time at);
std::optional<loom::v1::RecoveryIncident> MarkResumed(loom::v1::Job& job, absl::Time at);
// The new attempt's first step, after resumed_step (the step it resumed
// after): steps_recomputed = the newest step reported before the failure -
// resumed_step.
std::optional<loom::v1::RecoveryIncident> MarkFirstStep(loom::v1::Job& job, absl::Time at,
                                                        int64_t resumed_step);
// The job ended (or gave up) while an incident was open: it is closed
// incomplete and returned.
std::optional<loom::v1::RecoveryIncident> CloseIncident(loom::v1::Job& job, absl::Time at);

// The phases an incident measured on its path (both boundaries reached), as
// (index into kRecoveryPhaseNames, seconds), in timeline order.
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
