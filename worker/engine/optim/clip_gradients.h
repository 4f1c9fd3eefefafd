// The engine's one gradient clipping: the global L2 norm of the whole model's
// gradient, wherever its parts live, and the scaling by ClipFactor. Every layout computes its norm here: each rank adds up
// the squares of the gradient it holds (a TP shard, a pipeline stage's
// chunks, a ZeRO shard of the DP-reduced gradient, or all of it), counting a
// slice that several TP ranks hold once, and the sum crosses the groups that
// split the gradient (ParallelContext::GradientNormGroups). The same norm and
// factor result on every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

// PyTorch's clip_grad_norm_: max_norm / (norm + 1e-6) when max_norm > 0 and
// the norm exceeds it, else 1 (nothing to scale).
float ClipFactor(double norm, double max_norm);

// `count` floats of backend memory at `data`; `replicas` TP ranks hold the
// same values (TensorView::replicas).
struct GradientPiece {
  float* data = nullptr;
  int64_t count = 0;
  int replicas = 1;
};

std::vector<GradientPiece> GradientPieces(const std::vector<TensorView>& grads);

// sqrt of the sum over `groups` (null entries skipped) of each rank's
// sum over pieces of ops.SumSquares / replicas. Each group sums a float (the
// share rounded to float costs ~1e-7 of the norm; every rank gets the same
// bits). Collective over every group in the list, in its order.
absl::StatusOr<double> GlobalGradientNorm(kernels::Ops& ops, const std::vector<GradientPiece>& pieces,
                                          const std::vector<comm::Communicator*>& groups);

// The norm above; when max_norm > 0 and it exceeds max_norm, every piece is
// scaled by ClipFactor (ops.Scale). Returns the norm before clipping.
absl::StatusOr<double> ClipGradients(kernels::Ops& ops, const std::vector<GradientPiece>& pieces,
                                     const std::vector<comm::Communicator*>& groups,
                                     double max_norm);

}  // namespace loom::engine
