#include "worker/engine/expert_parallel/ep_gradients.h"

#include <span>

namespace loom::engine {

bool IsExpertParameter(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos;
}

absl::Status ReduceDenseGradientsOverEp(kernels::Ops& ops, comm::Communicator* ep,
                                        const std::vector<TensorView>& grads) {
  if (ep == nullptr || ep->size() <= 1) return absl::OkStatus();
  float* run = nullptr;
  int64_t run_size = 0;
  auto flush = [&]() -> absl::Status {
    if (run_size == 0) return absl::OkStatus();
    absl::Status s = ep->AllReduce(std::span<float>(run, static_cast<size_t>(run_size)));
    run = nullptr;
    run_size = 0;
    return s;
  };
  ops.Synchronize();  // the collective reads gradients the backward may still be writing
  for (const TensorView& g : grads) {
    if (IsExpertParameter(g.name) || g.numel() == 0) {
      if (absl::Status s = flush(); !s.ok()) return s;
      continue;
    }
    if (run != nullptr && run + run_size == g.data) {
      run_size += g.numel();
      continue;
    }
    if (absl::Status s = flush(); !s.ok()) return s;
    run = g.data;
    run_size = g.numel();
  }
  return flush();
}

std::vector<GradientPiece> EpGradientPieces(const std::vector<TensorView>& grads, int ep_size) {
  std::vector<GradientPiece> pieces = GradientPieces(grads);
  for (size_t i = 0; i < grads.size() && i < pieces.size(); ++i) {
    if (!IsExpertParameter(grads[i].name)) pieces[i].replicas *= ep_size;
  }
  return pieces;
}

absl::Status ReduceDensePiecesOverEp(kernels::Ops& ops, comm::Communicator* ep,
                                     const std::vector<GradientPiece>& pieces,
                                     const std::vector<std::string>& names) {
  if (ep == nullptr || ep->size() <= 1) return absl::OkStatus();
  ops.Synchronize();
  for (size_t i = 0; i < pieces.size() && i < names.size(); ++i) {
    if (IsExpertParameter(names[i]) || pieces[i].count == 0) continue;
    if (absl::Status s = ep->AllReduce(std::span<float>(pieces[i].data, static_cast<size_t>(pieces[i].count)));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

std::vector<GradientPiece> EpShardPieces(std::vector<GradientPiece> pieces,
                                         const std::vector<std::string>& names, int ep_size) {
  for (size_t i = 0; i < pieces.size() && i < names.size(); ++i) {
    if (!IsExpertParameter(names[i])) pieces[i].replicas *= ep_size;
  }
  return pieces;
}

}  // namespace loom::engine
