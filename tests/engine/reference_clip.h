// Global-norm clipping of one process's whole gradient in host memory, in
// double: the reference the engine's ClipGradients (worker/engine/optim/
// clip_gradients.h, any layout, any backend) is compared with in tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "worker/engine/optim/clip_gradients.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine::testing {

// sqrt(sum of squares) over all elements, accumulated in double in a fixed
// order (per-tensor partial sums keep long tensors from losing small terms).
inline double GlobalNorm(const std::vector<TensorView>& tensors) {
  double total = 0.0;
  for (const TensorView& t : tensors) {
    double partial = 0.0;
    for (int64_t i = 0; i < t.numel(); ++i) partial += static_cast<double>(t.data[i]) * t.data[i];
    total += partial;
  }
  return std::sqrt(total);
}

// Scales every gradient by ClipFactor(norm, max_norm); returns the norm
// before clipping.
inline double ClipByGlobalNorm(const std::vector<TensorView>& grads, double max_norm) {
  const double norm = GlobalNorm(grads);
  if (const float scale = ClipFactor(norm, max_norm); scale != 1.0f) {
    for (const TensorView& g : grads) {
      for (int64_t i = 0; i < g.numel(); ++i) g.data[i] *= scale;
    }
  }
  return norm;
}

}  // namespace loom::engine::testing
