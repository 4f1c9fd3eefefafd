// Exit codes of loom-trainer that the coordinator interprets. Shared by the
// trainer and the coordinator through this header only.
#pragma once

namespace loom {

inline constexpr int kExitOk = 0;
// Any other non-zero code or a signal is a crash worth a restart.
inline constexpr int kExitCrash = 1;
// The job itself is broken (bad spec, missing data file, unreadable
// checkpoint): restarting cannot help, so the job fails at once.
inline constexpr int kExitJobBroken = 3;
// A collective passed its timeout and the watchdog aborted the rank (also: a
// rank of an in-place attempt that was stopped and told no next attempt).
inline constexpr int kExitCollectiveTimeout = 4;
// The rank's attempt is superseded (its commit gate or its token was
// refused): it stopped without acting (docs/fault_tolerance.md, "Fencing").
inline constexpr int kExitFenced = 5;
// The rank stopped gracefully when asked (preemption, a drain, SIGUSR1): the
// whole job agreed to stop after the same step and saved a checkpoint of it,
// so the job resumes from exactly that step (docs/scheduling.md).
inline constexpr int kExitStopped = 6;

}  // namespace loom
