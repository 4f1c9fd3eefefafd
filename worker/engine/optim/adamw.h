// AdamW over a model's parameter list, with the first and second moments (m,
// v) in fp32 owned here. On the CPU backend the parameters are fp32 and are
// themselves the master weights. Weight decay applies to matrices only: 1-D
// tensors (the RMSNorm weights) are never decayed.
#pragma once

#include <cstdint>
#include <vector>

#include "common/spec/job_spec.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

class AdamW {
 public:
  // params and grads: same order, names and shapes; their storage must outlive
  // the optimizer. Hyper-parameters come from the spec (beta1, beta2, eps,
  // weight_decay); the learning rate is given per step.
  AdamW(std::vector<TensorView> params, std::vector<TensorView> grads,
        const spec::TrainSpec& train);

  // Applies one update with this learning rate and advances step() by one
  // (bias correction uses the new step, starting at 1).
  void Step(double lr);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  // Moments as named views for checkpoints: "optimizer.exp_avg.<param>" and
  // "optimizer.exp_avg_sq.<param>", shapes as the parameter's.
  std::vector<TensorView> States();

  static bool DecaysWeight(const TensorView& param) { return param.shape.size() >= 2; }

 private:
  std::vector<TensorView> params_;
  std::vector<TensorView> grads_;
  std::vector<std::vector<float>> m_;
  std::vector<std::vector<float>> v_;
  spec::TrainSpec train_;
  int64_t step_ = 0;
};

}  // namespace loom::engine
