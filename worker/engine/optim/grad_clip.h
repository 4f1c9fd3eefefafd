// Global-norm gradient clipping over every gradient tensor of the model. Call
// it on the full, DP-reduced gradient so every rank clips by the same factor.
#pragma once

#include <vector>

#include "kernels/ops.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

// sqrt(sum of squares) over all elements, accumulated in double in a fixed order.
// Host memory (the multi-rank CPU paths).
double GlobalNorm(const std::vector<TensorView>& tensors);

// When max_norm > 0 and the norm exceeds it, scales every gradient by
// max_norm / (norm + 1e-6) (PyTorch's clip_grad_norm_). Returns the norm
// before clipping. Host memory.
double ClipByGlobalNorm(const std::vector<TensorView>& grads, double max_norm);

// The same on backend memory, through ops: each tensor's sum of squares is
// ops.SumSquares (double, the backend's fixed order), summed over tensors in
// order on the host; the scaling is ops.Scale. Same clipping rule.
double GlobalNorm(kernels::Ops& ops, const std::vector<TensorView>& tensors);
double ClipByGlobalNorm(kernels::Ops& ops, const std::vector<TensorView>& grads, double max_norm);

}  // namespace loom::engine
