// The data side of context parallelism: every CP rank draws the same
// sequences (the sampler is a pure function of step and index) and keeps
// only its two zigzag chunks of each (zigzag.h), inputs and targets alike.
#pragma once

#include "absl/status/status.h"
#include "worker/engine/data/batch_sampler.h"
#include "worker/engine/parallel/parallel_context.h"

namespace loom::engine {

// In place: batch->seq becomes the local length and inputs/targets this
// rank's chunks. No-op without CP. INVALID_ARGUMENT (naming seq_len and cp)
// when the sequences do not split into 2 * cp chunks.
absl::Status KeepLocalChunks(const ParallelContext& ctx, Batch* batch);

}  // namespace loom::engine
