// Plain host implementations of the mixture-of-experts ops of the ops API
// (ops.h: MoeRoute, MoePermute, MoeUnpermute, MoeGateGrad, MoeRouterBackward),
// in the order of additions the ops promise, so a backend that follows them
// matches bit for bit (the combine uses fma, which every compiler and the GPU
// round alike). The CPU backend parallelizes these loops over tokens
// (kernels/cpu/moe.cc); the CUDA kernels (kernels/cuda/ops/moe.cu) are held
// to them by tests/kernels/moe_ops_test.cc and tests/gpu/moe_ops_gpu_test.cc.
// The engine's host routing (worker/engine/model/moe_router.h) is this code.
// std-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/ops.h"

namespace loom::kernels::reference {

// Scores, probs, choices and weights of token t (the per-token part of
// MoeRoute). `order` is scratch of E entries.
inline void MoeRouteToken(const MoeRouteDims& d, int64_t t, const float* logits, const float* bias,
                          int32_t* expert, float* weight, float* scores, float* probs,
                          int32_t* order) {
  const int64_t e_count = d.num_experts, k = d.top_k;
  const float* l = logits + t * e_count;
  float* s = scores + t * e_count;
  float* p = probs + t * e_count;
  // Scores in double, stored as float.
  double total = 0;
  if (d.score == MoeScore::kSoftmax) {
    const double max = *std::max_element(l, l + e_count);
    for (int64_t e = 0; e < e_count; ++e) total += std::exp(static_cast<double>(l[e]) - max);
    for (int64_t e = 0; e < e_count; ++e) {
      s[e] = p[e] = static_cast<float>(std::exp(static_cast<double>(l[e]) - max) / total);
    }
  } else {
    for (int64_t e = 0; e < e_count; ++e) {
      s[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
      total += s[e];
    }
    for (int64_t e = 0; e < e_count; ++e) p[e] = static_cast<float>(s[e] / total);
  }
  auto select = [&](int32_t e) {
    return static_cast<double>(s[e]) + (bias != nullptr ? static_cast<double>(bias[e]) : 0.0);
  };
  std::iota(order, order + e_count, 0);
  std::partial_sort(order, order + k, order + e_count, [&](int32_t a, int32_t b) {
    const double sa = select(a), sb = select(b);
    return sa != sb ? sa > sb : a < b;
  });
  double chosen = 0;
  for (int64_t j = 0; j < k; ++j) chosen += s[order[j]];
  for (int64_t j = 0; j < k; ++j) {
    const int32_t e = order[j];
    expert[t * k + j] = e;
    weight[t * k + j] = static_cast<float>(s[e] / chosen);
  }
}

// The capacity drop and the permuted order (the sequential part of MoeRoute):
// a counting sort of the assignments by expert, stable.
inline void MoeRouteRows(const MoeRouteDims& d, const int32_t* expert, int32_t* row_of,
                         int32_t* assignment_of, int64_t* counts) {
  const int64_t e_count = d.num_experts, assignments = d.tokens * d.top_k;
  int64_t* kept = counts;
  int64_t* routed = counts + e_count;
  std::fill(counts, counts + 2 * e_count, int64_t{0});
  for (int64_t a = 0; a < assignments; ++a) {
    const int32_t e = expert[a];
    ++routed[e];
    if (d.capacity > 0 && kept[e] >= d.capacity) {
      row_of[a] = -1;
    } else {
      row_of[a] = static_cast<int32_t>(kept[e]++);  // rank inside the expert, for now
    }
  }
  std::vector<int64_t> first(static_cast<size_t>(e_count), 0);
  for (int64_t e = 1; e < e_count; ++e) first[e] = first[e - 1] + kept[e - 1];
  for (int64_t a = 0; a < assignments; ++a) {
    if (row_of[a] < 0) continue;
    row_of[a] = static_cast<int32_t>(first[expert[a]] + row_of[a]);
    assignment_of[row_of[a]] = static_cast<int32_t>(a);
  }
}

// prob_sum[e] = sum over tokens of probs[t, e], in token order.
inline void MoeProbSums(const MoeRouteDims& d, const float* probs, double* prob_sum) {
  for (int64_t e = 0; e < d.num_experts; ++e) {
    double sum = 0;
    for (int64_t t = 0; t < d.tokens; ++t) sum += probs[t * d.num_experts + e];
    prob_sum[e] = sum;
  }
}

inline void MoeRoute(const MoeRouteDims& d, const float* logits, const float* bias,
                     int32_t* expert, float* weight, float* scores, float* probs, int32_t* row_of,
                     int32_t* assignment_of, int64_t* counts, double* prob_sum) {
  std::vector<int32_t> order(static_cast<size_t>(d.num_experts));
  for (int64_t t = 0; t < d.tokens; ++t) {
    MoeRouteToken(d, t, logits, bias, expert, weight, scores, probs, order.data());
  }
  MoeRouteRows(d, expert, row_of, assignment_of, counts);
  MoeProbSums(d, probs, prob_sum);
}

inline void MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                       const int32_t* assignment_of, const float* weight, float* out) {
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t a = assignment_of[row];
    const float* src = x + (a / top_k) * width;
    float* dst = out + row * width;
    if (weight == nullptr) {
      for (int64_t c = 0; c < width; ++c) dst[c] = src[c];
    } else {
      const float w = weight[a];
      for (int64_t c = 0; c < width; ++c) dst[c] = src[c] * w;
    }
  }
}

inline void MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                         const int32_t* row_of, const float* weight, float* out) {
  for (int64_t t = 0; t < tokens; ++t) {
    float* dst = out + t * width;
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t a = t * top_k + j;
      if (row_of[a] < 0) continue;  // dropped by the capacity
      const float* src = in + static_cast<int64_t>(row_of[a]) * width;
      const float w = weight != nullptr ? weight[a] : 1.0f;
      // One fused multiply-add per element, so every backend and compiler
      // rounds the same way (a contracted or uncontracted += would not).
      for (int64_t c = 0; c < width; ++c) dst[c] = std::fma(w, src[c], dst[c]);
    }
  }
}

inline float MoeGateGradOne(int64_t width, const float* dy, const float* row) {
  double dot = 0;
  for (int64_t c = 0; c < width; ++c) dot += static_cast<double>(dy[c]) * row[c];
  return static_cast<float>(dot);
}

inline void MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy,
                        const float* rows, const int32_t* row_of, float* d_weight) {
  for (int64_t a = 0; a < tokens * top_k; ++a) {
    d_weight[a] = row_of[a] < 0 ? 0.0f
                                : MoeGateGradOne(width, dy + (a / top_k) * width,
                                                 rows + static_cast<int64_t>(row_of[a]) * width);
  }
}

// d(aux)/d(probs[t, e]), the same for every token t.
inline double MoeAuxGrad(const MoeRouteDims& d, const int64_t* counts, double aux_scale,
                         int64_t e) {
  if (d.aux_loss_coef <= 0) return 0.0;
  const int64_t* routed = counts + d.num_experts;
  return aux_scale * d.aux_loss_coef * static_cast<double>(d.num_experts) *
         static_cast<double>(routed[e]) / static_cast<double>(d.tokens * d.top_k) /
         static_cast<double>(d.tokens);
}

// MoeRouterBackward for token t; `ds` is scratch of E doubles, `g_aux` the
// MoeAuxGrad of each expert.
inline void MoeRouterBackwardToken(const MoeRouteDims& d, int64_t t, const int32_t* expert,
                                   const float* weight, const float* scores, const float* probs,
                                   const double* g_aux, const float* d_weight, double* ds,
                                   float* d_logits) {
  const int64_t e_count = d.num_experts, k = d.top_k;
  const float* s = scores + t * e_count;
  const float* p = probs + t * e_count;
  std::fill(ds, ds + e_count, 0.0);
  // weight_j = s_{e_j} / sum_i s_{e_i}: ds_{e_j} = (dw_j - sum_i dw_i w_i) / sum_i s_{e_i}.
  double chosen = 0, dot = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t a = t * k + j;
    chosen += s[expert[a]];
    dot += static_cast<double>(d_weight[a]) * weight[a];
  }
  for (int64_t j = 0; j < k; ++j) {
    const int64_t a = t * k + j;
    ds[expert[a]] += (d_weight[a] - dot) / chosen;
  }
  float* out = d_logits + t * e_count;
  if (d.score == MoeScore::kSoftmax) {
    for (int64_t e = 0; e < e_count; ++e) ds[e] += g_aux[e];
    double sd = 0;
    for (int64_t e = 0; e < e_count; ++e) sd += ds[e] * s[e];
    for (int64_t e = 0; e < e_count; ++e) out[e] = static_cast<float>(s[e] * (ds[e] - sd));
  } else {
    // probs = s / sum(s): d/ds_e = (g_e - sum_e' g_e' p_e') / sum(s).
    double total = 0, gp = 0;
    for (int64_t e = 0; e < e_count; ++e) {
      total += s[e];
      gp += g_aux[e] * p[e];
    }
    for (int64_t e = 0; e < e_count; ++e) {
      const double g = ds[e] + (g_aux[e] - gp) / total;
      out[e] = static_cast<float>(g * s[e] * (1.0 - s[e]));
    }
  }
}

inline void MoeRouterBackward(const MoeRouteDims& d, const int32_t* expert, const float* weight,
                              const float* scores, const float* probs, const int64_t* counts,
                              const float* d_weight, double aux_scale, float* d_logits) {
  std::vector<double> g_aux(static_cast<size_t>(d.num_experts)), ds(g_aux.size());
  for (int64_t e = 0; e < d.num_experts; ++e) g_aux[e] = MoeAuxGrad(d, counts, aux_scale, e);
  for (int64_t t = 0; t < d.tokens; ++t) {
    MoeRouterBackwardToken(d, t, expert, weight, scores, probs, g_aux.data(), d_weight, ds.data(),
                           d_logits);
  }
}

}  // namespace loom::kernels::reference
