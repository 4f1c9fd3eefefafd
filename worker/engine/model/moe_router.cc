#include "worker/engine/model/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace loom::engine {

int64_t ExpertCapacity(double factor, int64_t tokens, int64_t top_k, int64_t num_experts) {
  if (factor <= 0 || num_experts <= 0) return 0;
  const double c = std::ceil(factor * static_cast<double>(tokens * top_k) /
                             static_cast<double>(num_experts));
  return std::max<int64_t>(1, static_cast<int64_t>(c));
}

MoeRouting Route(const MoeDims& d, const float* logits, const float* bias, double* aux_loss) {
  const int64_t t_count = d.tokens, e_count = d.num_experts, k = d.top_k;
  MoeRouting r;
  r.expert.resize(static_cast<size_t>(t_count * k));
  r.weight.resize(static_cast<size_t>(t_count * k));
  r.scores.resize(static_cast<size_t>(t_count * e_count));
  r.probs.resize(static_cast<size_t>(t_count * e_count));
  r.routed.assign(static_cast<size_t>(e_count), 0);
  std::vector<int32_t> order(static_cast<size_t>(e_count));
  std::vector<double> select(static_cast<size_t>(e_count));
  for (int64_t t = 0; t < t_count; ++t) {
    const float* l = logits + t * e_count;
    float* s = r.scores.data() + t * e_count;
    float* p = r.probs.data() + t * e_count;
    // Scores in double, stored as float: the reference computes in float64.
    double total = 0;
    if (d.score == RouterScore::kSoftmax) {
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
    for (int64_t e = 0; e < e_count; ++e) {
      select[static_cast<size_t>(e)] = static_cast<double>(s[e]) + (bias != nullptr ? bias[e] : 0.0);
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      if (select[static_cast<size_t>(a)] != select[static_cast<size_t>(b)]) {
        return select[static_cast<size_t>(a)] > select[static_cast<size_t>(b)];
      }
      return a < b;
    });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += s[order[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      r.expert[static_cast<size_t>(t * k + j)] = e;
      r.weight[static_cast<size_t>(t * k + j)] = static_cast<float>(s[e] / chosen);
      ++r.routed[static_cast<size_t>(e)];
    }
  }
  // Capacity drops in assignment order, then the permuted order by a
  // counting sort (stable: each expert's rows in assignment order).
  const int64_t assignments = t_count * k;
  r.counts.assign(static_cast<size_t>(e_count), 0);
  r.row_of.assign(static_cast<size_t>(assignments), -1);
  std::vector<char> kept(static_cast<size_t>(assignments), 1);
  for (int64_t a = 0; a < assignments; ++a) {
    int64_t& n = r.counts[static_cast<size_t>(r.expert[static_cast<size_t>(a)])];
    if (d.capacity > 0 && n >= d.capacity) {
      kept[static_cast<size_t>(a)] = 0;
      ++r.dropped;
    } else {
      ++n;
    }
  }
  std::vector<int64_t> next(static_cast<size_t>(e_count), 0);
  for (int64_t e = 1; e < e_count; ++e) {
    next[static_cast<size_t>(e)] = next[static_cast<size_t>(e - 1)] + r.counts[static_cast<size_t>(e - 1)];
  }
  r.assignment_of.resize(static_cast<size_t>(assignments - r.dropped));
  for (int64_t a = 0; a < assignments; ++a) {
    if (!kept[static_cast<size_t>(a)]) continue;
    const int64_t row = next[static_cast<size_t>(r.expert[static_cast<size_t>(a)])]++;
    r.row_of[static_cast<size_t>(a)] = static_cast<int32_t>(row);
    r.assignment_of[static_cast<size_t>(row)] = static_cast<int32_t>(a);
  }
  if (aux_loss != nullptr) {
    double sum = 0;
    for (int64_t e = 0; e < e_count; ++e) {
      double mean_p = 0;
      for (int64_t t = 0; t < t_count; ++t) mean_p += r.probs[static_cast<size_t>(t * e_count + e)];
      mean_p /= static_cast<double>(t_count);
      sum += static_cast<double>(r.routed[static_cast<size_t>(e)]) /
             static_cast<double>(assignments) * mean_p;
    }
    *aux_loss = d.aux_loss_coef * static_cast<double>(e_count) * sum;
  }
  return r;
}

std::vector<float> RouterBackward(const MoeDims& d, const MoeRouting& r,
                                  const std::vector<float>& d_weight, double aux_scale) {
  const int64_t t_count = d.tokens, e_count = d.num_experts, k = d.top_k;
  std::vector<float> d_logits(static_cast<size_t>(t_count * e_count));
  // d(aux)/d(probs[t, e]) = coef * E * f_e / tokens, the same for every token.
  std::vector<double> g_aux(static_cast<size_t>(e_count), 0.0);
  if (d.aux_loss_coef > 0) {
    const double assignments = static_cast<double>(t_count * k);
    for (int64_t e = 0; e < e_count; ++e) {
      g_aux[static_cast<size_t>(e)] = aux_scale * d.aux_loss_coef * static_cast<double>(e_count) *
                                      static_cast<double>(r.routed[static_cast<size_t>(e)]) /
                                      assignments / static_cast<double>(t_count);
    }
  }
  std::vector<double> ds(static_cast<size_t>(e_count));
  for (int64_t t = 0; t < t_count; ++t) {
    const float* s = r.scores.data() + t * e_count;
    const float* p = r.probs.data() + t * e_count;
    std::fill(ds.begin(), ds.end(), 0.0);
    // weight_j = s_{e_j} / sum_i s_{e_i}: ds_{e_j} = (dw_j - sum_i dw_i w_i) / sum_i s_{e_i}.
    double chosen = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) {
      const size_t a = static_cast<size_t>(t * k + j);
      chosen += s[r.expert[a]];
      dot += static_cast<double>(d_weight[a]) * r.weight[a];
    }
    for (int64_t j = 0; j < k; ++j) {
      const size_t a = static_cast<size_t>(t * k + j);
      ds[static_cast<size_t>(r.expert[a])] += (d_weight[a] - dot) / chosen;
    }
    if (d.score == RouterScore::kSoftmax) {
      for (int64_t e = 0; e < e_count; ++e) ds[static_cast<size_t>(e)] += g_aux[static_cast<size_t>(e)];
      double sd = 0;
      for (int64_t e = 0; e < e_count; ++e) sd += ds[static_cast<size_t>(e)] * s[e];
      for (int64_t e = 0; e < e_count; ++e) {
        d_logits[static_cast<size_t>(t * e_count + e)] =
            static_cast<float>(s[e] * (ds[static_cast<size_t>(e)] - sd));
      }
    } else {
      // probs = s / sum(s): d/ds_e = (g_e - sum_e' g_e' p_e') / sum(s).
      double total = 0, gp = 0;
      for (int64_t e = 0; e < e_count; ++e) {
        total += s[e];
        gp += g_aux[static_cast<size_t>(e)] * p[e];
      }
      for (int64_t e = 0; e < e_count; ++e) {
        const double g = ds[static_cast<size_t>(e)] + (g_aux[static_cast<size_t>(e)] - gp) / total;
        d_logits[static_cast<size_t>(t * e_count + e)] =
            static_cast<float>(g * s[e] * (1.0 - s[e]));
      }
    }
  }
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
