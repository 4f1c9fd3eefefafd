#include "worker/engine/optim/adamw.h"

#include <utility>

namespace loom::engine {

AdamW::AdamW(std::vector<TensorView> params, std::vector<TensorView> grads,
             const spec::TrainSpec& train, kernels::Ops& ops)
    : params_(std::move(params)), grads_(std::move(grads)), ops_(ops), train_(train) {
  m_.reserve(params_.size());
  v_.reserve(params_.size());
  for (const TensorView& p : params_) {
    const int64_t n = p.numel();
    m_buffers_.push_back(ops_.AllocateFloats(n));
    v_buffers_.push_back(ops_.AllocateFloats(n));
    ops_.Fill(m_buffers_.back().f32(), n, 0.0f);
    ops_.Fill(v_buffers_.back().f32(), n, 0.0f);
    m_.push_back(m_buffers_.back().f32());
    v_.push_back(v_buffers_.back().f32());
  }
}

void AdamW::Step(double lr) {
  ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const float decay = DecaysWeight(params_[i]) ? static_cast<float>(train_.weight_decay) : 0.0f;
    ops_.AdamW(params_[i].data, grads_[i].data, m_[i], v_[i], params_[i].numel(),
               static_cast<float>(lr), static_cast<float>(train_.beta1),
               static_cast<float>(train_.beta2), static_cast<float>(train_.eps), decay, step_);
  }
}

std::vector<TensorView> AdamW::States() {
  std::vector<TensorView> out;
  out.reserve(2 * params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({"optimizer.exp_avg." + params_[i].name, params_[i].shape, m_[i]});
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({"optimizer.exp_avg_sq." + params_[i].name, params_[i].shape, v_[i]});
  }
  return out;
}

}  // namespace loom::engine
