#include "coordinator/jobs/job_states.h"

namespace loom::coordinator {

using loom::v1::JobState;

bool IsTerminal(JobState state) {
  return state == JobState::SUCCEEDED || state == JobState::FAILED ||
         state == JobState::CANCELLED;
}

bool HoldsDevices(JobState state) {
  return state == JobState::STARTING || state == JobState::RUNNING ||
         state == JobState::RESTARTING || state == JobState::RECOVERING;
}

bool CanTransition(JobState from, JobState to) {
  if (IsTerminal(from) || from == to || from == JobState::JOB_STATE_UNSPECIFIED) return false;
  // Any live job can be cancelled or fail.
  if (to == JobState::CANCELLED || to == JobState::FAILED) return true;
  switch (from) {
    case JobState::PENDING:
    case JobState::PREEMPTED:  // placed again, to resume from its saved step
      return to == JobState::STARTING;
    case JobState::STARTING:
      // A very short job can finish before every rank has said it is ready.
      return to == JobState::RUNNING || to == JobState::RESTARTING ||
             to == JobState::RECOVERING || to == JobState::SUCCEEDED ||
             to == JobState::PREEMPTED;
    case JobState::RUNNING:
      return to == JobState::SUCCEEDED || to == JobState::RESTARTING ||
             to == JobState::RECOVERING || to == JobState::PREEMPTED;
    case JobState::RECOVERING:
      // Repaired in place, or the whole job restarts after all (fallback).
      return to == JobState::RUNNING || to == JobState::RESTARTING;
    case JobState::RESTARTING:
      return to == JobState::STARTING;
    default:
      return false;
  }
}

}  // namespace loom::coordinator
