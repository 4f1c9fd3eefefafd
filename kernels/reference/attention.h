// Reference attention: the full score matrix per (batch, head), softmax in
// double, and the textbook backward through it. Shares AttentionDims (and its
// layouts, masking and GQA rule) with the tiled kernels it checks. std-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/ops.h"

namespace loom::kernels::reference {

inline bool AttentionVisible(const AttentionDims& d, int64_t i, int64_t j) {
  return !d.causal || d.kv_offset + j <= d.q_offset + i;
}

// P[i, j] of one (b, h) in double; a fully masked row stays all zero.
template <typename T>
inline std::vector<double> AttentionProbs(const AttentionDims& d, const T* q, const T* k,
                                          int64_t b, int64_t h, std::vector<double>* lse) {
  const int64_t kvh = h / (d.num_heads / d.num_kv_heads);
  std::vector<double> p(static_cast<size_t>(d.seq_q * d.seq_kv), 0.0);
  lse->assign(static_cast<size_t>(d.seq_q), -std::numeric_limits<double>::infinity());
  for (int64_t i = 0; i < d.seq_q; ++i) {
    const T* qi = q + (b * d.seq_q + i) * d.q_row_stride + h * d.head_dim;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < d.seq_kv; ++j) {
      if (!AttentionVisible(d, i, j)) continue;
      const T* kj = k + (b * d.seq_kv + j) * d.k_row_stride + kvh * d.head_dim;
      double s = 0;
      for (int64_t e = 0; e < d.head_dim; ++e) s += static_cast<double>(qi[e]) * kj[e];
      p[i * d.seq_kv + j] = s * d.scale;
      if (s * d.scale > mx) mx = s * d.scale;
    }
    if (mx == -std::numeric_limits<double>::infinity()) continue;
    double sum = 0;
    for (int64_t j = 0; j < d.seq_kv; ++j)
      if (AttentionVisible(d, i, j)) sum += std::exp(p[i * d.seq_kv + j] - mx);
    for (int64_t j = 0; j < d.seq_kv; ++j)
      p[i * d.seq_kv + j] =
          AttentionVisible(d, i, j) ? std::exp(p[i * d.seq_kv + j] - mx) / sum : 0.0;
    (*lse)[i] = mx + std::log(sum);
  }
  return p;
}

template <typename T>
inline void AttentionForward(const AttentionDims& d, const T* q, const T* k,
                             const T* v, T* out, T* lse) {
  std::vector<double> row_lse;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.num_heads; ++h) {
      const int64_t kvh = h / (d.num_heads / d.num_kv_heads);
      const std::vector<double> p = AttentionProbs(d, q, k, b, h, &row_lse);
      for (int64_t i = 0; i < d.seq_q; ++i) {
        lse[(b * d.num_heads + h) * d.seq_q + i] = static_cast<T>(row_lse[i]);
        for (int64_t e = 0; e < d.head_dim; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < d.seq_kv; ++j)
            acc += p[i * d.seq_kv + j] * v[(b * d.seq_kv + j) * d.v_row_stride + kvh * d.head_dim + e];
          out[(b * d.seq_q + i) * d.o_row_stride + h * d.head_dim + e] = static_cast<T>(acc);
        }
      }
    }
}

// dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)), dQ = scale dS K,
// dK = scale dS^T Q; kv-head gradients sum over the heads of their group.
inline void AttentionBackward(const AttentionDims& d, const float* q, const float* k,
                              const float* v, const float* d_out, float* dq, float* dk,
                              float* dv) {
  const int64_t hd = d.head_dim;
  for (int64_t t = 0; t < d.batch * d.seq_q; ++t)
    for (int64_t e = 0; e < d.num_heads * hd; ++e) dq[t * d.q_row_stride + e] = 0;
  for (int64_t t = 0; t < d.batch * d.seq_kv; ++t)
    for (int64_t e = 0; e < d.num_kv_heads * hd; ++e) {
      dk[t * d.k_row_stride + e] = 0;
      dv[t * d.v_row_stride + e] = 0;
    }
  std::vector<double> row_lse;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.num_heads; ++h) {
      const int64_t kvh = h / (d.num_heads / d.num_kv_heads);
      const std::vector<double> p = AttentionProbs(d, q, k, b, h, &row_lse);
      auto qp = [&](int64_t i) { return q + (b * d.seq_q + i) * d.q_row_stride + h * hd; };
      auto kp = [&](int64_t j) { return k + (b * d.seq_kv + j) * d.k_row_stride + kvh * hd; };
      auto vp = [&](int64_t j) { return v + (b * d.seq_kv + j) * d.v_row_stride + kvh * hd; };
      auto dop = [&](int64_t i) { return d_out + (b * d.seq_q + i) * d.o_row_stride + h * hd; };
      for (int64_t i = 0; i < d.seq_q; ++i) {
        std::vector<double> dp(static_cast<size_t>(d.seq_kv), 0.0);
        double dot = 0;
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          double s = 0;
          for (int64_t e = 0; e < hd; ++e) s += static_cast<double>(dop(i)[e]) * vp(j)[e];
          dp[j] = s;
          dot += s * p[i * d.seq_kv + j];
        }
        for (int64_t j = 0; j < d.seq_kv; ++j) {
          const double pij = p[i * d.seq_kv + j];
          const double ds = pij * (dp[j] - dot) * d.scale;
          for (int64_t e = 0; e < hd; ++e) {
            dv[(b * d.seq_kv + j) * d.v_row_stride + kvh * hd + e] +=
                static_cast<float>(pij * dop(i)[e]);
            dq[(b * d.seq_q + i) * d.q_row_stride + h * hd + e] += static_cast<float>(ds * kp(j)[e]);
            dk[(b * d.seq_kv + j) * d.k_row_stride + kvh * hd + e] +=
                static_cast<float>(ds * qp(i)[e]);
          }
        }
      }
    }
}

// Ops::AttentionMerge in double: two partial results of the same queries
// against disjoint key sets combine into the result against their union.
inline void AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                           int64_t out_row_stride, float* lse, const float* block_out,
                           int64_t block_row_stride, const float* block_lse) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < seq; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      const double a = lse[h * seq + i], b = block_lse[h * seq + i];
      if (b == neg_inf) continue;
      const double merged =
          a == neg_inf ? b : std::max(a, b) + std::log(std::exp(a - std::max(a, b)) +
                                                       std::exp(b - std::max(a, b)));
      const double wa = a == neg_inf ? 0.0 : std::exp(a - merged), wb = std::exp(b - merged);
      float* o = out + i * out_row_stride + h * head_dim;
      const float* bo = block_out + i * block_row_stride + h * head_dim;
      for (int64_t e = 0; e < head_dim; ++e)
        o[e] = static_cast<float>((a == neg_inf ? 0.0 : o[e] * wa) + bo[e] * wb);
      lse[h * seq + i] = static_cast<float>(merged);
    }
}

}  // namespace loom::kernels::reference
