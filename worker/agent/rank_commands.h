// The commands a coordinator session gives the node's ranks. RankManager is
// the real implementation; tests of the session may use their own.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "loom/v1/node.pb.h"

namespace loom::agent {

class RankCommands {
 public:
  virtual ~RankCommands() = default;
  // Starts one rank; failures are also reported as that rank's exit.
  virtual absl::Status Launch(const loom::v1::RankAssignment& assignment) = 0;
  // Kills the matching ranks; returns how many were signalled.
  virtual int Kill(const loom::v1::KillRanks& kill) = 0;
  // In-place recovery: tells the job's ranks of that attempt to abort their
  // communicators (on their control streams); returns how many were told.
  virtual int Abort(const loom::v1::AbortRanks& abort) = 0;
  // A graceful stop: tells the job's ranks of that attempt (every attempt
  // when 0) to stop after their next step, saving it; returns how many were told.
  virtual int Stop(const loom::v1::StopRanks& stop) = 0;
  // Moves the named survivors to the new attempt (token, namespace, what
  // they report) and tells each its own entry; returns how many moved.
  virtual int EnterEpoch(const loom::v1::EnterEpoch& epoch) = 0;
  // `loomctl trace`: tells the listed ranks (all when none are listed) of
  // that job and attempt to record the step; returns how many were told.
  virtual int Trace(const loom::v1::TraceStep& trace) = 0;
  // Continues paused ranks the coordinator still counts; returns how many.
  virtual int Resume(const loom::v1::ResumeRanks& resume) = 0;
  // The ranks alive now (launched and not yet reaped).
  virtual std::vector<loom::v1::RunningRank> Running() const = 0;
};

}  // namespace loom::agent
