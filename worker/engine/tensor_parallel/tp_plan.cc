#include "worker/engine/tensor_parallel/tp_plan.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec_rules.h"

namespace loom::engine {

absl::Status CheckTensorParallel(const spec::ModelSpec& c, int tp) {
  // The rulebook's TP rules (common/spec/job_spec_rules.h), as submission
  // and the planner apply them.
  spec::AxisShape shape;
  shape.num_heads = c.num_heads;
  shape.num_kv_heads = c.num_kv_heads;
  shape.ffn_hidden_size = c.ffn_hidden_size;
  shape.vocab_size = c.vocab_size;
  shape.num_layers = c.num_layers;
  const std::vector<std::string> broken = spec::CheckTpSplit(shape, tp);
  if (broken.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(broken, "; "));
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
