#include "worker/engine/tensor_parallel/tp_plan.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace loom::engine {

absl::Status CheckTensorParallel(const spec::ModelSpec& c, int tp) {
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("parallelism.tp=", tp, " must be >= 1"));
  if (tp == 1) return absl::OkStatus();
  const std::string where = absl::StrCat(" (parallelism.tp=", tp, ")");
  if (c.num_heads % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.num_heads=", c.num_heads, " must be divisible by the tensor-parallel size", where));
  }
  if (c.ffn_hidden_size % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.ffn_hidden_size=", c.ffn_hidden_size,
                                                   " must be divisible by the tensor-parallel size",
                                                   where));
  }
  const int64_t kv = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
  if (kv % tp != 0 && tp % kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.num_kv_heads=", kv, " must divide or be divisible by the tensor-parallel size",
        where, ": kv heads are split when tp divides them and replicated when they divide tp"));
  }
  if (c.vocab_size < tp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.vocab_size=", c.vocab_size, " must be at least the tensor-parallel size", where));
  }
  return absl::OkStatus();
}

TpPlan MakeTpPlan(const spec::ModelSpec& c, int rank, int size, bool sequence_parallel) {
  TpPlan p;
  p.rank = rank;
  p.size = size;
  p.sequence_parallel = sequence_parallel && size > 1;
  const int64_t kv = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
  p.heads = c.num_heads / size;
  p.head_first = rank * p.heads;
  if (kv % size == 0) {
    p.kv_heads = kv / size;
    p.kv_head_first = rank * p.kv_heads;
    p.kv_replicas = 1;
  } else {
    // size is a multiple of kv: this rank's query heads all read one kv head.
    const int64_t group = c.num_heads / kv;
    p.kv_heads = 1;
    p.kv_head_first = p.head_first / group;
    p.kv_replicas = static_cast<int>(size / kv);
  }
  p.ffn = c.ffn_hidden_size / size;
  p.ffn_first = rank * p.ffn;
  p.vocab_first = c.vocab_size * rank / size;
  p.vocab = c.vocab_size * (rank + 1) / size - p.vocab_first;
  return p;
}

}  // namespace loom::engine
