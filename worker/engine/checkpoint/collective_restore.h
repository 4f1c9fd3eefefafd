// Restoring the newest loadable checkpoint step on every rank of a job, each
// rank reading (and CRC-checking) only the files that hold shards of its own
// pieces (StepFiles::kNeeded), while all ranks still load the SAME step.
//
// Why a collective: with per-rank reads, a corrupt file refuses a step only
// on the ranks that need it; if every rank fell back on its own, those ranks
// would load an older step and the others the newer one. So the ranks decide
// each candidate step together, newest first, in rounds over the mesh groups
// (the save's groups, distributed_save.h):
//   1. the first rank (rank 0 of every group) broadcasts the candidate step
//      from its listing of root (-1: no more; the others never list root,
//      so a listing that differs across nodes cannot split them);
//   2. every rank prepares that step for its pieces (opens it, checks the
//      model and shapes, reads and verifies the files it needs), copying
//      nothing;
//   3. the ranks sum their failures; the step is loaded (copied into every
//      rank's pieces) only when no rank failed, otherwise every rank moves
//      on to the next candidate, and the targets stay untouched.
// A corrupt file thus refuses the step on every rank, exactly as when each
// rank read the whole step, while a rank reads only its share: one small
// broadcast and one all-reduce per candidate step. A file no rank needs is
// never read here (export and `loomctl export` still verify every file).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/checkpoint/checkpoint_loader.h"

namespace loom::engine {

// Collective over `mesh` (null entries are axes of one rank). NOT_FOUND when
// root holds no step directory (a fresh start, on every rank);
// FAILED_PRECONDITION listing the refusals when every step was refused on
// some rank. Each refusal line is this rank's own error, or says that other
// ranks refused the step (their logs name the file).
absl::StatusOr<LoadedCheckpoint> RestoreNewestOnMesh(kernels::Ops& ops,
                                                     const std::vector<comm::Communicator*>& mesh,
                                                     const std::string& root,
                                                     const spec::ModelSpec& model,
                                                     const std::vector<CheckpointRect>& into);

}  // namespace loom::engine
