#include "worker/engine/optim/grad_clip.h"

#include <cmath>

namespace loom::engine {

double GlobalNorm(const std::vector<TensorView>& tensors) {
  double total = 0.0;
  for (const TensorView& t : tensors) {
    const int64_t n = t.numel();
    // Per-tensor partial sums keep long tensors from losing small terms.
    double partial = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = t.data[i];
      partial += x * x;
    }
    total += partial;
  }
  return std::sqrt(total);
}

double ClipByGlobalNorm(const std::vector<TensorView>& grads, double max_norm) {
  const double norm = GlobalNorm(grads);
  if (max_norm > 0.0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    for (const TensorView& g : grads) {
      const int64_t n = g.numel();
      for (int64_t i = 0; i < n; ++i) g.data[i] *= scale;
    }
  }
  return norm;
}

}  // namespace loom::engine

namespace loom::engine {

double GlobalNorm(kernels::Ops& ops, const std::vector<TensorView>& tensors) {
  double total = 0.0;
  for (const TensorView& t : tensors) total += ops.SumSquares(t.data, t.numel());
  return std::sqrt(total);
}

double ClipByGlobalNorm(kernels::Ops& ops, const std::vector<TensorView>& grads,
                        double max_norm) {
  const double norm = GlobalNorm(ops, grads);
  if (max_norm > 0.0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    for (const TensorView& g : grads) ops.Scale(g.numel(), scale, g.data);
  }
  return norm;
}

}  // namespace loom::engine
