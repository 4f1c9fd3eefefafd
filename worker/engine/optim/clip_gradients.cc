#include "worker/engine/optim/clip_gradients.h"

#include <cmath>

#include "worker/engine/model/host_floats.h"
#include "worker/engine/optim/grad_clip.h"

namespace loom::engine {

std::vector<GradientPiece> GradientPieces(const std::vector<TensorView>& grads) {
  std::vector<GradientPiece> pieces;
  pieces.reserve(grads.size());
  for (const TensorView& g : grads) pieces.push_back({g.data, g.numel(), g.replicas});
  return pieces;
}

absl::StatusOr<double> GlobalGradientNorm(kernels::Ops& ops, const std::vector<GradientPiece>& pieces,
                                          const std::vector<comm::Communicator*>& groups) {
  double total = 0.0;
  for (const GradientPiece& p : pieces) {
    if (p.count > 0) total += ops.SumSquares(p.data, p.count) / p.replicas;
  }
  for (comm::Communicator* group : groups) {
    if (group == nullptr || group->size() <= 1) continue;
    float share = static_cast<float>(total);
    if (absl::Status s = AllReduceHostFloats(ops, group, &share, 1); !s.ok()) return s;
    total = share;
  }
  return std::sqrt(total);
}

absl::StatusOr<double> ClipGradients(kernels::Ops& ops, const std::vector<GradientPiece>& pieces,
                                     const std::vector<comm::Communicator*>& groups,
                                     double max_norm) {
  absl::StatusOr<double> norm = GlobalGradientNorm(ops, pieces, groups);
  if (!norm.ok()) return norm;
  if (const float scale = ClipFactor(*norm, max_norm); scale != 1.0f) {
    for (const GradientPiece& p : pieces) {
      if (p.count > 0) ops.Scale(p.count, scale, p.data);
    }
  }
  return norm;
}

}  // namespace loom::engine
