// The MoE router's arithmetic on host arrays (docs/moe.md): scores, top-k
// selection with the auxiliary-loss-free bias, renormalized gate weights,
// capacity drops, the permuted order, the auxiliary loss, and the router's
// backward from the gate weights' gradient to the logits'. Route and
// RouterBackward are the reference of the backend ops the layer runs
// (kernels::Ops::MoeRoute, MoeRouterBackward; kernels/reference/moe.h holds
// the one copy of the loops), for tests and tools on the host.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "worker/engine/model/moe_layer.h"

namespace loom::engine {

// Routes `d.tokens` rows from their router logits [tokens, E] (host). `bias`
// ([E] or null) is added to the scores for selection only. Token t's choices
// are the top_k experts by score + bias (ties: the lower expert id), in that
// order; their weights are the scores renormalized to sum to 1. With
// d.capacity > 0 an expert keeps its first d.capacity assignments in
// assignment order and the rest are dropped (weight kept, output zero).
// Returns the routing and writes the micro-batch's aux loss
// (d.aux_loss_coef * E * sum_e f_e * P_e, f_e = routed_e / (tokens * top_k),
// P_e = mean over tokens of probs[t, e]) to *aux_loss.
MoeRouting Route(const MoeDims& d, const float* logits, const float* bias, double* aux_loss);

// d(objective)/d(logits) [tokens, E] (host) given d(objective)/d(weight[a])
// for every assignment (`d_weight`, [tokens * top_k]; zero for dropped ones)
// and the weight of the aux loss in the objective (`aux_scale`, the
// micro-batch's loss scale). The selection (and so f_e) is constant.
std::vector<float> RouterBackward(const MoeDims& d, const MoeRouting& r,
                                  const std::vector<float>& d_weight, double aux_scale);

// The backend ops' description of a layer's routing.
kernels::MoeRouteDims RouteDims(const MoeDims& d);

// coef * E * sum_e f_e * P_e from the assignments per expert before the drop
// (`routed`, [E]) and the column sums of probs (`prob_sum`, [E]).
double AuxLoss(const MoeDims& d, const int64_t* routed, const double* prob_sum);

// Capacity per expert for `tokens` rows: ceil(factor * tokens * top_k / E);
// 0 (dropless) when factor <= 0.
int64_t ExpertCapacity(double factor, int64_t tokens, int64_t top_k, int64_t num_experts);

// DeepSeek-V3's auxiliary-loss-free update of one layer's selection bias from
// the expert load of a step (routed assignments per expert, summed over
// micro-batches and data-parallel ranks): bias_e += rate * sign(mean - load_e).
void UpdateSelectionBias(const double* load, int64_t num_experts, double rate, float* bias);

}  // namespace loom::engine
