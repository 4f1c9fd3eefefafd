// The clipping rule, and global-norm clipping of host tensors (one process's
// whole gradient: the reference the tests compare with). The engine clips
// through ClipGradients (optim/clip_gradients.h), which spans the parallel
// context's groups and uses the same ClipFactor.
#pragma once

#include <vector>

#include "worker/engine/tensor_view.h"

namespace loom::engine {

// PyTorch's clip_grad_norm_: max_norm / (norm + 1e-6) when max_norm > 0 and
// the norm exceeds it, else 1 (nothing to scale).
float ClipFactor(double norm, double max_norm);

// sqrt(sum of squares) over all elements, accumulated in double in a fixed order.
// Host memory (the multi-rank CPU paths).
double GlobalNorm(const std::vector<TensorView>& tensors);

// Scales every gradient by ClipFactor(norm). Returns the norm before
// clipping. Host memory.
double ClipByGlobalNorm(const std::vector<TensorView>& grads, double max_norm);

}  // namespace loom::engine
