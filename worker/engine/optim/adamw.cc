#include "worker/engine/optim/adamw.h"

#include "kernels/cpu/adamw.h"

namespace loom::engine {

AdamW::AdamW(std::vector<TensorView> params, std::vector<TensorView> grads,
             const spec::TrainSpec& train)
    : params_(std::move(params)), grads_(std::move(grads)), train_(train) {
  m_.reserve(params_.size());
  v_.reserve(params_.size());
  for (const TensorView& p : params_) {
    m_.emplace_back(static_cast<size_t>(p.numel()), 0.0f);
    v_.emplace_back(static_cast<size_t>(p.numel()), 0.0f);
  }
}

void AdamW::Step(double lr) {
  ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const float decay = DecaysWeight(params_[i]) ? static_cast<float>(train_.weight_decay) : 0.0f;
    kernels::cpu::AdamWStep(params_[i].data, grads_[i].data, m_[i].data(), v_[i].data(),
                            params_[i].numel(), static_cast<float>(lr),
                            static_cast<float>(train_.beta1), static_cast<float>(train_.beta2),
                            static_cast<float>(train_.eps), decay, step_);
  }
}

std::vector<TensorView> AdamW::States() {
  std::vector<TensorView> out;
  out.reserve(2 * params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({"optimizer.exp_avg." + params_[i].name, params_[i].shape, m_[i].data()});
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({"optimizer.exp_avg_sq." + params_[i].name, params_[i].shape, v_[i].data()});
  }
  return out;
}

}  // namespace loom::engine
