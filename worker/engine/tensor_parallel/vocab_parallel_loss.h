// Cross-entropy over vocabulary-parallel logits: each TP rank holds the
// logit columns of its vocabulary rows, [rows, vocab shard]. The ranks
// exchange two numbers per row (the shard's log-sum-exp and, where the target
// falls in the shard, the target's logit), never the logits: the global
// log-sum-exp is the log-sum-exp of the shards', and the loss of a row is
// that minus the target logit. Internal to the model.
//
// Memory: the stats are computed and all-gathered in backend buffers; the
// gathered 2 x rows x tp floats are copied down explicitly and combined on
// the host (there is no log-sum-exp-over-shards op), and the global
// log-sum-exp goes back up for the backward. No host access to the logits.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "worker/engine/tensor_parallel/tp_collectives.h"

namespace loom::engine {

class VocabParallelLoss {
 public:
  VocabParallelLoss(kernels::Ops* ops, TpCollectives* coll, int64_t vocab_first, int64_t vocab)
      : ops_(ops), coll_(coll), vocab_first_(vocab_first), vocab_(vocab) {}

  // Returns the sum of the row losses over rows whose target is >= 0 (the
  // same on every rank). With backward, overwrites the logits with
  // grad_scale * (softmax - onehot) restricted to this shard's columns.
  // targets_device and targets_host hold the same global ids.
  double Run(float* logits, const int32_t* targets_device, const int32_t* targets_host,
             int64_t rows, bool backward, float grad_scale);

 private:
  void Reserve(int64_t rows);

  kernels::Ops* ops_;
  TpCollectives* coll_;
  int64_t vocab_first_, vocab_;
  int64_t capacity_ = 0;
  kernels::Buffer stats_;     // [2 rows]: shard log-sum-exp, then target logit
  kernels::Buffer gathered_;  // [tp, 2 rows]
  kernels::Buffer lse_;       // [rows]: the global log-sum-exp
  std::vector<float> host_gathered_, host_lse_;
};

}  // namespace loom::engine
