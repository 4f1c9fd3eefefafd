#include "worker/engine/model/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/reference/moe.h"

namespace loom::engine {

int64_t ExpertCapacity(double factor, int64_t tokens, int64_t top_k, int64_t num_experts) {
  if (factor <= 0 || num_experts <= 0) return 0;
  const double c = std::ceil(factor * static_cast<double>(tokens * top_k) /
                             static_cast<double>(num_experts));
  return std::max<int64_t>(1, static_cast<int64_t>(c));
}

kernels::MoeRouteDims RouteDims(const MoeDims& d) {
  kernels::MoeRouteDims r;
  r.tokens = d.tokens;
  r.num_experts = d.num_experts;
  r.top_k = d.top_k;
  r.capacity = d.capacity;
  r.score = d.score == RouterScore::kSoftmax ? kernels::MoeScore::kSoftmax
                                             : kernels::MoeScore::kSigmoid;
  r.aux_loss_coef = d.aux_loss_coef;
  return r;
}

double AuxLoss(const MoeDims& d, const int64_t* routed, const double* prob_sum) {
  const double assignments = static_cast<double>(d.tokens * d.top_k);
  double sum = 0;
  for (int64_t e = 0; e < d.num_experts; ++e) {
    const double mean_p = prob_sum[e] / static_cast<double>(d.tokens);
    sum += static_cast<double>(routed[e]) / assignments * mean_p;
  }
  return d.aux_loss_coef * static_cast<double>(d.num_experts) * sum;
}

MoeRouting Route(const MoeDims& d, const float* logits, const float* bias, double* aux_loss) {
  const size_t assignments = static_cast<size_t>(d.tokens * d.top_k);
  const size_t e_count = static_cast<size_t>(d.num_experts);
  MoeRouting r;
  r.expert.resize(assignments);
  r.weight.resize(assignments);
  r.scores.resize(static_cast<size_t>(d.tokens) * e_count);
  r.probs.resize(r.scores.size());
  r.row_of.resize(assignments);
  r.assignment_of.resize(assignments);
  std::vector<int64_t> counts(2 * e_count);
  std::vector<double> prob_sum(e_count);
  kernels::reference::MoeRoute(RouteDims(d), logits, bias, r.expert.data(), r.weight.data(),
                               r.scores.data(), r.probs.data(), r.row_of.data(),
                               r.assignment_of.data(), counts.data(), prob_sum.data());
  r.counts.assign(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(e_count));
  r.routed.assign(counts.begin() + static_cast<std::ptrdiff_t>(e_count), counts.end());
  const int64_t kept = std::accumulate(r.counts.begin(), r.counts.end(), int64_t{0});
  r.assignment_of.resize(static_cast<size_t>(kept));
  r.dropped = static_cast<int64_t>(assignments) - kept;
  if (aux_loss != nullptr) *aux_loss = AuxLoss(d, r.routed.data(), prob_sum.data());
  return r;
}

std::vector<float> RouterBackward(const MoeDims& d, const MoeRouting& r,
                                  const std::vector<float>& d_weight, double aux_scale) {
  std::vector<float> d_logits(static_cast<size_t>(d.tokens * d.num_experts));
  std::vector<int64_t> counts(r.counts);
  counts.insert(counts.end(), r.routed.begin(), r.routed.end());
  kernels::reference::MoeRouterBackward(RouteDims(d), r.expert.data(), r.weight.data(),
                                        r.scores.data(), r.probs.data(), counts.data(),
                                        d_weight.data(), aux_scale, d_logits.data());
  return d_logits;
}

void UpdateSelectionBias(const double* load, int64_t num_experts, double rate, float* bias) {
  double mean = 0;
  for (int64_t e = 0; e < num_experts; ++e) mean += load[e];
  mean /= static_cast<double>(num_experts);
  for (int64_t e = 0; e < num_experts; ++e) {
    const double gap = mean - load[e];
    const double sign = gap > 0 ? 1.0 : (gap < 0 ? -1.0 : 0.0);
    bias[e] = static_cast<float>(bias[e] + rate * sign);
  }
}

}  // namespace loom::engine
