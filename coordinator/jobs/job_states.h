// The job state machine: which transitions are legal. Pure.
#pragma once

#include "loom/v1/job.pb.h"

namespace loom::coordinator {

bool IsTerminal(loom::v1::JobState state);
bool CanTransition(loom::v1::JobState from, loom::v1::JobState to);
// Jobs holding devices (their ranks may be alive).
bool HoldsDevices(loom::v1::JobState state);

}  // namespace loom::coordinator
