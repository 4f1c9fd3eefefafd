// How a Llama model is cut over a tensor-parallel group of `size` ranks:
// which query heads, kv heads, FFN columns and vocabulary rows this rank
// holds. Megatron-style: q/k/v and gate/up are column-parallel (split by
// output rows), o_proj and down_proj row-parallel (split by input columns),
// embedding and LM head vocabulary-parallel. Pure, no I/O.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"

namespace loom::engine {

struct TpPlan {
  int rank = 0;
  int size = 1;
  bool sequence_parallel = false;
  int64_t heads = 0, head_first = 0;        // query heads [head_first, +heads)
  int64_t kv_heads = 0, kv_head_first = 0;  // kv heads [kv_head_first, +kv_heads)
  // Ranks holding each of this rank's kv heads: 1 when size divides the kv
  // heads; size / num_kv_heads when the kv heads are replicated instead.
  int kv_replicas = 1;
  int64_t ffn = 0, ffn_first = 0;      // gate/up rows and down columns
  int64_t vocab = 0, vocab_first = 0;  // embedding / LM head rows (may be uneven)

  bool active() const { return size > 1; }
};

// INVALID_ARGUMENT naming the field when `config` cannot be cut `tp_size`
// ways: heads and ffn_hidden_size must divide by tp, num_kv_heads must divide
// or be divided by tp, and every rank needs at least one vocabulary row.
absl::Status CheckTensorParallel(const spec::ModelSpec& config, int tp_size);

// The cut for `rank` of `size` (config as CheckTensorParallel accepts).
// size 1 gives the whole model.
TpPlan MakeTpPlan(const spec::ModelSpec& config, int rank, int size, bool sequence_parallel);

}  // namespace loom::engine
