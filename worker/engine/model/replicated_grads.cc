#include "worker/engine/model/replicated_grads.h"

namespace loom::engine {

// Scratch layout, per layer: [input_norm, post_norm] (SP), then one slot per
// kv head of the model, [k rows; v rows] (replicated kv); the final norm last
// (SP). A rank writes only its own kv head's slot, so the group sum of a slot
// is the sum over exactly the ranks holding that head.
ReplicatedGrads::ReplicatedGrads(kernels::Ops* ops, TpCollectives* coll,
                                 const spec::ModelSpec& c, const TpPlan& plan,
                                 const ParameterLayout* layout)
    : ops_(ops), coll_(coll), layout_(layout), hidden_(c.hidden_size) {
  if (!plan.active()) return;
  norms_ = plan.sequence_parallel;
  if (plan.kv_replicas > 1) {
    kv_slot_ = 2 * plan.kv_heads * c.head_dim() * c.hidden_size;
    kv_slots_ = c.num_kv_heads;
    kv_mine_ = plan.kv_head_first;
    q_floats_ = plan.heads * c.head_dim() * c.hidden_size;
  }
  per_layer_ = (norms_ ? 2 * hidden_ : 0) + kv_slots_ * kv_slot_;
  total_ = c.num_layers * per_layer_ + (norms_ ? hidden_ : 0);
  if (total_ > 0) scratch_ = ops_->AllocateFloats(total_);
}

void ReplicatedGrads::Zero() {
  if (total_ > 0) ops_->Fill(scratch_.f32(), total_, 0.0f);
}

void ReplicatedGrads::Redirect(int64_t layer, BlockGrads* g) const {
  float* base = scratch_.f32() + layer * per_layer_;
  if (norms_) {
    g->input_norm = base;
    g->post_norm = base + hidden_;
    base += 2 * hidden_;
  }
  if (kv_slot_ > 0) g->kv = base + kv_mine_ * kv_slot_;
}

float* ReplicatedGrads::FinalNorm(float* grads) const {
  return norms_ ? scratch_.f32() + total_ - hidden_ : grads + layout_->final_norm;
}

void ReplicatedGrads::ReduceLayer(int64_t layer, float* grads) {
  if (per_layer_ == 0) return;
  float* base = scratch_.f32() + layer * per_layer_;
  coll_->AllReduce(base, per_layer_);
  const LayerOffsets& o = layout_->layers[static_cast<size_t>(layer)];
  if (norms_) {
    ops_->Axpy(hidden_, 1.0f, base, grads + o.input_norm);
    ops_->Axpy(hidden_, 1.0f, base + hidden_, grads + o.post_norm);
    base += 2 * hidden_;
  }
  // This rank's k and v rows follow its q rows in the fused qkv gradient.
  if (kv_slot_ > 0) ops_->Axpy(kv_slot_, 1.0f, base + kv_mine_ * kv_slot_, grads + o.qkv + q_floats_);
}

void ReplicatedGrads::ReduceFinal(float* grads) {
  if (!norms_) return;
  float* slot = scratch_.f32() + total_ - hidden_;
  coll_->AllReduce(slot, hidden_);
  ops_->Axpy(hidden_, 1.0f, slot, grads + layout_->final_norm);
}

}  // namespace loom::engine
