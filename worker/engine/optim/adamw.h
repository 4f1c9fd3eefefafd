// AdamW over a model's parameter list, with the first and second moments (m,
// v) in fp32 owned here. The parameters are fp32 and are themselves the
// master weights. Weight decay applies to matrices only: 1-D tensors (the
// RMSNorm weights) are never decayed.
//
// The moments are the backend's memory (device memory on a GPU) and every
// update is ops.AdamW, so nothing here touches the tensors from the host; the
// backend is the rank's (MakeOpsForJob, ops_selection.h).
#pragma once

#include <cstdint>
#include <vector>

#include "common/spec/job_spec.h"
#include "kernels/ops.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

class AdamW {
 public:
  // params and grads: same order, names and shapes, in `ops`'s memory; their
  // storage and `ops` must outlive the optimizer. Hyper-parameters come from
  // the spec (beta1, beta2, eps, weight_decay); the learning rate is given per
  // step. Moments start at zero.
  AdamW(std::vector<TensorView> params, std::vector<TensorView> grads,
        const spec::TrainSpec& train, kernels::Ops& ops);

  // Applies one update with this learning rate and advances step() by one
  // (bias correction uses the new step, starting at 1).
  void Step(double lr);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  // Moments as named views for checkpoints: "optimizer.exp_avg.<param>" and
  // "optimizer.exp_avg_sq.<param>", shapes as the parameter's, in the
  // backend's memory.
  std::vector<TensorView> States();
  // The backend the moments live on.
  kernels::Ops& ops() const { return ops_; }

  static bool DecaysWeight(const TensorView& param) { return param.shape.size() >= 2; }

 private:
  std::vector<TensorView> params_;
  std::vector<TensorView> grads_;
  kernels::Ops& ops_;
  // One backend buffer per tensor and moment, so each starts aligned as the
  // backend allocates.
  std::vector<kernels::Buffer> m_buffers_, v_buffers_;
  std::vector<float*> m_, v_;
  spec::TrainSpec train_;
  int64_t step_ = 0;
};

}  // namespace loom::engine
