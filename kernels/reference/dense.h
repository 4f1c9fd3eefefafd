// Plain, obviously-correct host implementations of the dense ops of the ops
// API (ops.h): GEMM, embedding, RMSNorm, RoPE, SwiGLU. Naive loops with double
// accumulation; the tests hold the fast backends to these. Forwards are templates
// so the gradient checks can run them in double. std-only.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/ops.h"

namespace loom::kernels::reference {

inline void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const float av = trans_a == Transpose::kNo ? a[i * lda + p] : a[p * lda + i];
        const float bv = trans_b == Transpose::kNo ? b[p * ldb + j] : b[j * ldb + p];
        sum += static_cast<double>(av) * bv;
      }
      const double old = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c[i * ldc + j];
      c[i * ldc + j] = static_cast<float>(alpha * sum + old);
    }
  }
}

template <typename T>
inline void EmbeddingForward(const int32_t* ids, int64_t num_tokens, const T* table,
                             int64_t dim, T* out) {
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t d = 0; d < dim; ++d) out[t * dim + d] = table[ids[t] * dim + d];
}

inline void EmbeddingBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                              int64_t dim, float* d_table) {
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t d = 0; d < dim; ++d) d_table[ids[t] * dim + d] += d_out[t * dim + d];
}

template <typename T>
inline void RmsNormForward(const T* x, const T* weight, int64_t rows, int64_t dim,
                           double eps, T* y, T* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += static_cast<double>(x[r * dim + d]) * x[r * dim + d];
    const double rs = 1.0 / std::sqrt(ss / dim + eps);
    rstd[r] = static_cast<T>(rs);
    for (int64_t d = 0; d < dim; ++d) y[r * dim + d] = static_cast<T>(x[r * dim + d] * rs * weight[d]);
  }
}

// y = w * x * r(x), r = (mean(x^2)+eps)^-1/2: dx = r*g - x * r^3 * mean(g*x), g = dy*w.
inline void RmsNormBackward(const float* d_y, const float* x, const float* weight, int64_t rows,
                            int64_t dim, float eps, float* dx, float* d_weight) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* dyr = d_y + r * dim;
    double ss = 0, gx = 0;
    for (int64_t d = 0; d < dim; ++d) {
      ss += static_cast<double>(xr[d]) * xr[d];
      gx += static_cast<double>(dyr[d]) * weight[d] * xr[d];
    }
    const double rs = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t d = 0; d < dim; ++d) {
      dx[r * dim + d] = static_cast<float>(rs * dyr[d] * weight[d] - xr[d] * rs * rs * rs * gx / dim);
      d_weight[d] += static_cast<float>(dyr[d] * xr[d] * rs);
    }
  }
}

// Positions are position_offset + s; angle p * theta^(-2i/head_dim), in double.
template <typename T>
inline void Rope(T* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                 int64_t row_stride, double theta, int64_t position_offset, bool inverse) {
  const int64_t half = head_dim / 2;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s)
      for (int64_t h = 0; h < heads; ++h) {
        T* v = x + (b * seq + s) * row_stride + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(position_offset + s) *
                               std::pow(theta, -2.0 * static_cast<double>(i) / head_dim);
          const double c = std::cos(angle), sn = inverse ? -std::sin(angle) : std::sin(angle);
          const double x1 = v[i], x2 = v[i + half];
          v[i] = static_cast<T>(x1 * c - x2 * sn);
          v[i + half] = static_cast<T>(x2 * c + x1 * sn);
        }
      }
}

template <typename T>
inline void SwiGluForward(int64_t rows, int64_t dim, const T* gate, const T* up,
                          int64_t in_stride, T* out, int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) {
      const double g = gate[r * in_stride + c];
      out[r * out_stride + c] = static_cast<T>(g / (1.0 + std::exp(-g)) * up[r * in_stride + c]);
    }
}

inline void SwiGluBackward(int64_t rows, int64_t dim, const float* gate, const float* up,
                           int64_t in_stride, const float* d_out, int64_t out_stride,
                           float* d_gate, float* d_up) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) {
      const double g = gate[r * in_stride + c], u = up[r * in_stride + c];
      const double d = d_out[r * out_stride + c];
      const double sig = 1.0 / (1.0 + std::exp(-g));
      d_up[r * in_stride + c] = static_cast<float>(d * g * sig);
      d_gate[r * in_stride + c] = static_cast<float>(d * u * sig * (1.0 + g * (1.0 - sig)));
    }
}

}  // namespace loom::kernels::reference
