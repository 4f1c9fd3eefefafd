#include "worker/engine/optim/clip_gradients.h"

#include <cmath>

#include "worker/engine/parallel/host_floats.h"

namespace loom::engine {

float ClipFactor(double norm, double max_norm) {
  if (max_norm <= 0.0 || norm <= max_norm) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

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
