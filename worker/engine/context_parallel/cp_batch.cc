#include "worker/engine/context_parallel/cp_batch.h"

#include "worker/engine/context_parallel/zigzag.h"

namespace loom::engine {

absl::Status KeepLocalChunks(const ParallelContext& ctx, Batch* batch) {
  if (ctx.cp == nullptr) return absl::OkStatus();
  absl::StatusOr<ZigzagSplit> z = ZigzagSplit::Make(batch->seq, ctx.cp_size());
  if (!z.ok()) return z.status();
  batch->inputs = LocalTokens(*z, ctx.cp_rank(), batch->inputs.data(), batch->batch);
  batch->targets = LocalTokens(*z, ctx.cp_rank(), batch->targets.data(), batch->batch);
  batch->seq = z->local_seq();
  return absl::OkStatus();
}

}  // namespace loom::engine
