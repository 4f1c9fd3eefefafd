// The job state machine: which transitions are legal. Pure.
//
//   PENDING -> STARTING -> RUNNING -> SUCCEEDED
//                 |    \      |
//                 |     RECOVERING -> RUNNING (in place: survivors kept, failed ranks relaunched)
//                 v         |
//              RESTARTING <-+      (whole job: every rank stopped, attempt n+1 placed)
//                 |
//                 +--> STARTING
// and every state that has not ended -> FAILED | CANCELLED.
#pragma once

#include "loom/v1/job.pb.h"

namespace loom::coordinator {

bool IsTerminal(loom::v1::JobState state);
bool CanTransition(loom::v1::JobState from, loom::v1::JobState to);
// Jobs holding devices (their ranks may be alive).
bool HoldsDevices(loom::v1::JobState state);

}  // namespace loom::coordinator
