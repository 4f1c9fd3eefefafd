#include "worker/engine/optim/grad_clip.h"

#include <cmath>

namespace loom::engine {

float ClipFactor(double norm, double max_norm) {
  if (max_norm <= 0.0 || norm <= max_norm) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

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
  if (const float scale = ClipFactor(norm, max_norm); scale != 1.0f) {
    for (const TensorView& g : grads) {
      const int64_t n = g.numel();
      for (int64_t i = 0; i < n; ++i) g.data[i] *= scale;
    }
  }
  return norm;
}

}  // namespace loom::engine
