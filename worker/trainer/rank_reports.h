// The reports a rank sends about itself (RankProgress): a step's record with
// the snapshots it holds, and the phases of its life (ready, resumed,
// aborted, finished).
#pragma once

#include <cstdint>
#include <string>

#include "loom/v1/rank.pb.h"
#include "worker/comm/collective_clock.h"
#include "worker/engine/progress.h"

namespace loom::trainer {

loom::v1::RankProgress StepReport(const engine::StepProgress& p);
// The step's timing (docs/observability.md): its compute is the time since
// the previous step's report (the step, its snapshot, its checkpoint: a rank
// stopped anywhere outside a collective shows) less what the collectives
// blocked it.
void SetTiming(const comm::StepCollectives& c, loom::v1::StepTiming* out);
void SetHoldings(const engine::SnapshotProgress& s, loom::v1::SnapshotHoldings* out);
// A report of `phase` after `step` (ready, resumed: with resumed_step too,
// aborted, finished).
loom::v1::RankProgress PhaseReport(const std::string& phase, int64_t step);

}  // namespace loom::trainer
