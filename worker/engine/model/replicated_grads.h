// Gradients of the parameters that several TP ranks hold: the norm weights
// under sequence parallelism (each rank sees only its rows, so its gradient
// is a partial sum) and kv heads replicated because the TP size does not
// divide them (each rank's query heads add only their share). A micro-batch's
// contributions go to a scratch buffer instead of the gradients; when a unit's
// backward ends they are summed over the TP group and added to the rank's
// gradients, so every replica holds the same full gradient before the
// unit's gradients are reported ready. Without SP the norm gradients need
// nothing: every rank computes them whole from the same replicated inputs.
// Internal to the model.
#pragma once

#include <cstdint>

#include "common/spec/job_spec.h"
#include "kernels/ops.h"
#include "worker/engine/model/llama_layer.h"
#include "worker/engine/model/parameter_layout.h"
#include "worker/engine/tensor_parallel/tp_collectives.h"
#include "worker/engine/tensor_parallel/tp_plan.h"

namespace loom::engine {

class ReplicatedGrads {
 public:
  ReplicatedGrads(kernels::Ops* ops, TpCollectives* coll, const spec::ModelSpec& config,
                  const TpPlan& plan, const ParameterLayout* layout);

  bool empty() const { return total_ == 0; }
  // Clears the scratch; call before each micro-batch's backward.
  void Zero();
  // Points layer l's replicated gradients in `g` at the scratch.
  void Redirect(int64_t layer, BlockGrads* g) const;
  // Where the final norm's gradient goes: the scratch under SP, else `grads`.
  float* FinalNorm(float* grads) const;
  // Sums layer l's (or the final norm's) scratch over the group and adds it
  // into the rank's gradients.
  void ReduceLayer(int64_t layer, float* grads);
  void ReduceFinal(float* grads);

 private:
  kernels::Ops* ops_;
  TpCollectives* coll_;
  const ParameterLayout* layout_;
  int64_t hidden_ = 0;
  bool norms_ = false;     // SP: norm weights replicated
  int64_t kv_slot_ = 0;    // floats of one kv head's [k; v] rows; 0: kv heads not replicated
  int64_t kv_slots_ = 0;   // kv heads in the model (every rank reduces them all)
  int64_t kv_mine_ = 0;    // this rank's kv head
  int64_t q_floats_ = 0;   // floats of this rank's q rows (the kv rows follow them)
  int64_t per_layer_ = 0;  // floats per layer in the scratch
  int64_t total_ = 0;
  kernels::Buffer scratch_;
};

}  // namespace loom::engine
