// Row-wise CPU kernels of the decoder layer: embedding, RMSNorm, RoPE, SwiGLU,
// and the squared norm. Reductions across rows (weight gradients, sums) go
// through fixed-size chunks summed in chunk order, so results do not depend on
// the number of threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {
constexpr int64_t kRowChunk = 64;
constexpr int64_t kColChunk = 64;
}  // namespace

void EmbeddingForward(const int32_t* ids, int64_t num_tokens, const float* table, int64_t vocab,
                      int64_t dim, float* out) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::copy(table + ids[t] * dim, table + (ids[t] + 1) * dim, out + t * dim);
  }
}

// Parallel over column blocks: each thread adds every token, in token order,
// into its own columns, so the scatter-add is deterministic without atomics.
void EmbeddingBackward(const int32_t* ids, int64_t num_tokens, const float* d_out, int64_t vocab,
                       int64_t dim, float* d_table) {
  const int64_t num_blocks = (dim + kColChunk - 1) / kColChunk;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t c0 = blk * kColChunk, c1 = std::min(dim, c0 + kColChunk);
    for (int64_t t = 0; t < num_tokens; ++t) {
      float* dst = d_table + ids[t] * dim;
      const float* src = d_out + t * dim;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

void RmsNormForward(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                    float* y, float* rstd) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float ss = DotV(xr, xr, dim);
    const float rs = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    rstd[r] = rs;
    float* yr = y + r * dim;
    for (int64_t d = 0; d < dim; ++d) yr[d] = xr[d] * rs * weight[d];
  }
}

void RmsNormBackward(const float* d_y, const float* x, const float* weight, const float* rstd,
                     int64_t rows, int64_t dim, float* dx, bool accumulate_dx, float* d_weight) {
  const int64_t num_chunks = (rows + kRowChunk - 1) / kRowChunk;
  std::vector<float> partial(num_chunks * dim, 0.0f);
  const float inv_dim = 1.0f / static_cast<float>(dim);
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    float* dw = partial.data() + chunk * dim;
    std::vector<float> gw_buf(dim);
    float* gw = gw_buf.data();
    const int64_t r1 = std::min(rows, (chunk + 1) * kRowChunk);
    for (int64_t r = chunk * kRowChunk; r < r1; ++r) {
      const float* xr = x + r * dim;
      const float* gr = d_y + r * dim;
      const float rs = rstd[r];
      for (int64_t d = 0; d < dim; ++d) gw[d] = gr[d] * weight[d];
      const float gx = DotV(gw, xr, dim);  // sum(dy * w * x)
      const float coef = gx * rs * rs * rs * inv_dim;
      float* dxr = dx + r * dim;
      if (accumulate_dx) {
        for (int64_t d = 0; d < dim; ++d) dxr[d] += rs * gw[d] - xr[d] * coef;
      } else {
        for (int64_t d = 0; d < dim; ++d) dxr[d] = rs * gw[d] - xr[d] * coef;
      }
      for (int64_t d = 0; d < dim; ++d) dw[d] += gr[d] * xr[d] * rs;
    }
  }
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    const float* dw = partial.data() + chunk * dim;
    for (int64_t d = 0; d < dim; ++d) d_weight[d] += dw[d];
  }
}

void RopeApply(float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
               int64_t row_stride, const float* cos, const float* sin, int64_t position_offset,
               bool inverse) {
  const int64_t half = head_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < batch * seq; ++t) {
    const int64_t pos = position_offset + t % seq;
    const float* c = cos + pos * half;
    const float* s = sin + pos * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* x1 = x + t * row_stride + h * head_dim;
      float* x2 = x1 + half;
      for (int64_t i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i], si = sign * s[i];
        x1[i] = a * c[i] - b * si;
        x2[i] = b * c[i] + a * si;
      }
    }
  }
}

void SwiGluForward(int64_t rows, int64_t dim, const float* gate, const float* up,
                   int64_t in_stride, float* out, int64_t out_stride) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate + r * in_stride;
    const float* u = up + r * in_stride;
    float* o = out + r * out_stride;
    int64_t c = 0;
    for (; c + 16 <= dim; c += 16) {
      const V16 gv = LoadV16(g + c);
      StoreV16(o + c, gv / (1.0f + FastExpV(-gv)) * LoadV16(u + c));
    }
    for (; c < dim; ++c) o[c] = g[c] / (1.0f + FastExp(-g[c])) * u[c];
  }
}

void SwiGluBackward(int64_t rows, int64_t dim, const float* gate, const float* up,
                    int64_t in_stride, const float* d_out, int64_t out_stride, float* d_gate,
                    float* d_up) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate + r * in_stride;
    const float* u = up + r * in_stride;
    const float* d = d_out + r * out_stride;
    float* dg = d_gate + r * in_stride;
    float* du = d_up + r * in_stride;
    int64_t c = 0;
    for (; c + 16 <= dim; c += 16) {
      const V16 gv = LoadV16(g + c), dv = LoadV16(d + c);
      const V16 sig = 1.0f / (1.0f + FastExpV(-gv));
      const V16 silu = gv * sig;
      StoreV16(du + c, dv * silu);
      StoreV16(dg + c, dv * LoadV16(u + c) * (sig + silu * (1.0f - sig)));
    }
    for (; c < dim; ++c) {
      const float sig = 1.0f / (1.0f + FastExp(-g[c]));
      const float silu = g[c] * sig;
      du[c] = d[c] * silu;
      dg[c] = d[c] * u[c] * (sig + silu * (1.0f - sig));
    }
  }
}

double SumSquares(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t num_chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(num_chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    const int64_t i1 = std::min(n, (chunk + 1) * kChunk);
    double sum = 0.0;
    for (int64_t i = chunk * kChunk; i < i1; ++i) sum += static_cast<double>(x[i]) * x[i];
    partial[chunk] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace loom::kernels::cpu
