// Gradients under expert parallelism. An EP rank holds its own experts and a
// replica of everything else (attention, norms, embeddings, the router, the
// shared experts), and reads its own data. So after the data-parallel
// reduction over the DP group (which holds the same experts: the
// expert-data-parallel group), the dense gradients still miss the other EP
// ranks' tokens: they are summed once more over the EP group, and the
// experts' are left alone. In the gradient norm a dense tensor is then held by
// every EP rank and counts once (replicas), an expert's by one.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/optim/clip_gradients.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

// A routed expert's weight (model.layers.<i>.mlp.experts.<e>.*), which only
// its EP rank holds; everything else is dense (replicated over EP).
bool IsExpertParameter(const std::string& name);

// Sums every dense gradient over `ep` (null or one rank: nothing to do), in
// place, one all-reduce per run of dense tensors that are contiguous in
// memory (the model's flat array: a few calls per step).
absl::Status ReduceDenseGradientsOverEp(kernels::Ops& ops, comm::Communicator* ep,
                                        const std::vector<TensorView>& grads);

// The pieces the norm adds up over the EP group (whole gradients, ZeRO 0 or
// 1): dense tensors count 1/ep_size on each EP rank, experts fully.
std::vector<GradientPiece> EpGradientPieces(const std::vector<TensorView>& grads, int ep_size);

// The same for a ZeRO >= 2 shard: `pieces` are this rank's owned pieces of
// the DP-reduced gradient and names[i] the tensor piece i belongs to. EP peers
// hold the same model layout and DP rank, so they own the same ranges: the
// dense pieces are summed over `ep` in place, and counted 1/ep_size in the
// norm (the pieces returned).
absl::Status ReduceDensePiecesOverEp(kernels::Ops& ops, comm::Communicator* ep,
                                     const std::vector<GradientPiece>& pieces,
                                     const std::vector<std::string>& names);
std::vector<GradientPiece> EpShardPieces(std::vector<GradientPiece> pieces,
                                         const std::vector<std::string>& names, int ep_size);

}  // namespace loom::engine
