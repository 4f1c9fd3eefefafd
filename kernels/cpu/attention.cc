// Tiled attention on the CPU, FlashAttention-2 style: 64 x 64 tiles of Q and
// K/V (a tile of each fits in L1/L2 for head_dim <= 128), the online softmax in
// the forward, and a backward that recomputes P from the saved log-sum-exp.
// Every product is a Panel64 (simd.h): outputs whose natural column count is
// head_dim are kept transposed ([head_dim][64]) so the 64-wide dimension is
// always the vector one.
//
// Parallelism and determinism: forward tasks are (batch, head, query tile) and
// write disjoint outputs. Backward tasks are (batch, kv head): one task owns
// the dK/dV of its kv head and the dQ of its query heads, and accumulates them
// in a fixed order, so no atomics and no run-to-run variation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kTile = kPanel;  // query and key tile size
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// dst[e][j] = src row j (token stride `stride`), element e; zero past `cols`.
void TransposeIn(const float* src, int64_t stride, int64_t cols, int64_t hd, float* dst) {
  for (int64_t e = 0; e < hd; ++e) {
    float* d = dst + e * kTile;
    for (int64_t j = 0; j < cols; ++j) d[j] = src[j * stride + e];
    for (int64_t j = cols; j < kTile; ++j) d[j] = 0.0f;
  }
}

// Number of keys of the tile starting at j0 visible to query i (may be <= 0).
inline int64_t VisibleCols(const AttentionDims& d, int64_t i, int64_t j0, int64_t cols) {
  if (!d.causal) return cols;
  const int64_t last_visible = i + d.q_offset - d.kv_offset;  // key index
  return std::min(cols, last_visible - j0 + 1);
}

}  // namespace

void AttentionForward(const AttentionDims& d, const float* q, const float* k, const float* v,
                      float* out, float* lse) {
  const int64_t hd = d.head_dim;
  const int64_t group = d.num_heads / d.num_kv_heads;
  const int64_t num_q_tiles = (d.seq_q + kTile - 1) / kTile;
  const int64_t num_tasks = d.batch * d.num_heads * num_q_tiles;
#pragma omp parallel
  {
    std::vector<float> kt(hd * kTile), s(kTile * kTile), pt(kTile * kTile), acc_t(hd * kTile);
    float m[kTile], l[kTile], alpha[kTile];
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_tasks; ++task) {
      const int64_t qt = task % num_q_tiles;
      const int64_t h = (task / num_q_tiles) % d.num_heads;
      const int64_t b = task / (num_q_tiles * d.num_heads);
      const int64_t kvh = h / group;
      const int64_t i0 = qt * kTile;
      const int64_t rows = std::min(kTile, d.seq_q - i0);
      const float* q_tile = q + (b * d.seq_q + i0) * d.q_row_stride + h * hd;
      const float* k_base = k + b * d.seq_kv * d.k_row_stride + kvh * hd;
      const float* v_base = v + b * d.seq_kv * d.v_row_stride + kvh * hd;
      int64_t kv_end = d.seq_kv;
      if (d.causal) {
        kv_end = std::clamp<int64_t>(i0 + rows + d.q_offset - d.kv_offset, 0, d.seq_kv);
      }
      std::fill(acc_t.begin(), acc_t.end(), 0.0f);
      std::fill(pt.begin(), pt.end(), 0.0f);
      for (int64_t i = 0; i < kTile; ++i) {
        m[i] = kNegInf;
        l[i] = 0.0f;
      }
      for (int64_t j0 = 0; j0 < kv_end; j0 += kTile) {
        const int64_t cols = std::min(kTile, kv_end - j0);
        TransposeIn(k_base + j0 * d.k_row_stride, d.k_row_stride, cols, hd, kt.data());
        Panel64(rows, hd, q_tile, d.q_row_stride, 1, kt.data(), s.data(), false);
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t visible = VisibleCols(d, i0 + i, j0, cols);
          float* si = s.data() + i * kTile;
          if (visible <= 0) {
            alpha[i] = 1.0f;
            for (int64_t j = 0; j < kTile; ++j) pt[j * kTile + i] = 0.0f;
            continue;
          }
          for (int64_t j = 0; j < visible; ++j) si[j] *= d.scale;
          const float mx = std::max(m[i], MaxV(si, visible));
          alpha[i] = m[i] == kNegInf ? 0.0f : FastExp(m[i] - mx);
          ExpShifted(si, mx, visible, si);
          const float row_sum = SumV(si, visible);
          for (int64_t j = 0; j < visible; ++j) pt[j * kTile + i] = si[j];
          for (int64_t j = visible; j < kTile; ++j) pt[j * kTile + i] = 0.0f;
          l[i] = l[i] * alpha[i] + row_sum;
          m[i] = mx;
        }
        for (int64_t i = rows; i < kTile; ++i) alpha[i] = 1.0f;
        for (int64_t e = 0; e < hd; ++e) {
          float* row = acc_t.data() + e * kTile;
          for (int64_t i = 0; i < kTile; ++i) row[i] *= alpha[i];
        }
        // acc_t[e][i] += sum_j V[j][e] * P^T[j][i]
        Panel64(hd, cols, v_base + j0 * d.v_row_stride, 1, d.v_row_stride, pt.data(),
                acc_t.data(), true);
      }
      for (int64_t i = 0; i < rows; ++i) {
        float* o = out + (b * d.seq_q + i0 + i) * d.o_row_stride + h * hd;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        for (int64_t e = 0; e < hd; ++e) o[e] = acc_t[e * kTile + i] * inv;
        lse[(b * d.num_heads + h) * d.seq_q + i0 + i] =
            l[i] > 0.0f ? m[i] + std::log(l[i]) : kNegInf;
      }
    }
  }
}

void AttentionBackward(const AttentionDims& d, const float* q, const float* k, const float* v,
                       const float* out, const float* lse, const float* d_out, float* dq,
                       float* dk, float* dv) {
  const int64_t hd = d.head_dim;
  const int64_t group = d.num_heads / d.num_kv_heads;
  const int64_t num_q_tiles = (d.seq_q + kTile - 1) / kTile;
  const int64_t num_tasks = d.batch * d.num_kv_heads;
#pragma omp parallel
  {
    std::vector<float> kt(hd * kTile), vt(hd * kTile), s(kTile * kTile), dp(kTile * kTile),
        ds(kTile * kTile), ds_t(kTile * kTile), dk_t(hd * kTile), dv_t(hd * kTile);
    std::vector<float> dq_t, delta;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_tasks; ++task) {
      const int64_t kvh = task % d.num_kv_heads;
      const int64_t b = task / d.num_kv_heads;
      const float* k_base = k + b * d.seq_kv * d.k_row_stride + kvh * hd;
      const float* v_base = v + b * d.seq_kv * d.v_row_stride + kvh * hd;
      auto q_at = [&](int64_t h, int64_t i) { return q + (b * d.seq_q + i) * d.q_row_stride + h * hd; };
      auto do_at = [&](int64_t h, int64_t i) {
        return d_out + (b * d.seq_q + i) * d.o_row_stride + h * hd;
      };
      // delta[g][i] = rowsum(dO * O), the softmax-backward correction term.
      delta.assign(group * d.seq_q, 0.0f);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        for (int64_t i = 0; i < d.seq_q; ++i) {
          const float* o = out + (b * d.seq_q + i) * d.o_row_stride + h * hd;
          const float* dof = do_at(h, i);
          delta[g * d.seq_q + i] = DotV(dof, o, hd);
        }
      }
      dq_t.assign(group * num_q_tiles * hd * kTile, 0.0f);
      for (int64_t j0 = 0; j0 < d.seq_kv; j0 += kTile) {
        const int64_t cols = std::min(kTile, d.seq_kv - j0);
        TransposeIn(k_base + j0 * d.k_row_stride, d.k_row_stride, cols, hd, kt.data());
        TransposeIn(v_base + j0 * d.v_row_stride, d.v_row_stride, cols, hd, vt.data());
        std::fill(dk_t.begin(), dk_t.end(), 0.0f);
        std::fill(dv_t.begin(), dv_t.end(), 0.0f);
        int64_t qt_start = 0;
        if (d.causal) {
          const int64_t first_query = j0 + d.kv_offset - d.q_offset;
          qt_start = std::max<int64_t>(0, first_query) / kTile;
          if (first_query >= d.seq_q) qt_start = num_q_tiles;
        }
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          const float* row_lse = lse + (b * d.num_heads + h) * d.seq_q;
          for (int64_t qt = qt_start; qt < num_q_tiles; ++qt) {
            const int64_t i0 = qt * kTile;
            const int64_t rows = std::min(kTile, d.seq_q - i0);
            Panel64(rows, hd, q_at(h, i0), d.q_row_stride, 1, kt.data(), s.data(), false);
            Panel64(rows, hd, do_at(h, i0), d.o_row_stride, 1, vt.data(), dp.data(), false);
            // s becomes P, ds becomes dS = P * (dP - delta) * scale.
            for (int64_t i = 0; i < rows; ++i) {
              const int64_t visible = std::max<int64_t>(0, VisibleCols(d, i0 + i, j0, cols));
              const float li = row_lse[i0 + i];
              const float di = delta[g * d.seq_q + i0 + i];
              float* si = s.data() + i * kTile;
              float* dsi = ds.data() + i * kTile;
              const float* dpi = dp.data() + i * kTile;
              if (li == kNegInf) {
                for (int64_t j = 0; j < kTile; ++j) si[j] = dsi[j] = 0.0f;
                continue;
              }
              for (int64_t j = 0; j < visible; ++j) si[j] *= d.scale;
              ExpShifted(si, li, visible, si);
              for (int64_t j = 0; j < visible; ++j) dsi[j] = si[j] * (dpi[j] - di) * d.scale;
              for (int64_t j = visible; j < kTile; ++j) si[j] = dsi[j] = 0.0f;
            }
            // dV^T[e][j] += sum_i dO[i][e] P[i][j];  dK^T[e][j] += sum_i Q[i][e] dS[i][j]
            Panel64(hd, rows, do_at(h, i0), 1, d.o_row_stride, s.data(), dv_t.data(), true);
            Panel64(hd, rows, q_at(h, i0), 1, d.q_row_stride, ds.data(), dk_t.data(), true);
            // dQ^T[e][i] += sum_j K[j][e] dS^T[j][i]
            for (int64_t j = 0; j < cols; ++j)
              for (int64_t i = 0; i < kTile; ++i)
                ds_t[j * kTile + i] = i < rows ? ds[i * kTile + j] : 0.0f;
            Panel64(hd, cols, k_base + j0 * d.k_row_stride, 1, d.k_row_stride, ds_t.data(),
                    dq_t.data() + (g * num_q_tiles + qt) * hd * kTile, true);
          }
        }
        for (int64_t j = 0; j < cols; ++j) {
          float* dkj = dk + (b * d.seq_kv + j0 + j) * d.k_row_stride + kvh * hd;
          float* dvj = dv + (b * d.seq_kv + j0 + j) * d.v_row_stride + kvh * hd;
          for (int64_t e = 0; e < hd; ++e) {
            dkj[e] = dk_t[e * kTile + j];
            dvj[e] = dv_t[e * kTile + j];
          }
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        for (int64_t i = 0; i < d.seq_q; ++i) {
          const float* src = dq_t.data() + (g * num_q_tiles + i / kTile) * hd * kTile + i % kTile;
          float* dst = dq + (b * d.seq_q + i) * d.q_row_stride + h * hd;
          for (int64_t e = 0; e < hd; ++e) dst[e] = src[e * kTile];
        }
      }
    }
  }
}

// Row by row; each (head, token) rescales its two partial outputs by their
// share of the merged normalizer. Rows are independent, so any split over
// threads gives the same bits.
void AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                    int64_t out_row_stride, float* lse, const float* block_out,
                    int64_t block_row_stride, const float* block_lse) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < seq; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const float b = block_lse[h * seq + i];
      if (b == kNegInf) continue;
      float& a = lse[h * seq + i];
      float* o = out + i * out_row_stride + h * head_dim;
      const float* bo = block_out + i * block_row_stride + h * head_dim;
      if (a == kNegInf) {
        for (int64_t e = 0; e < head_dim; ++e) o[e] = bo[e];
        a = b;
        continue;
      }
      const float mx = std::max(a, b);
      const float merged = mx + std::log(std::exp(a - mx) + std::exp(b - mx));
      const float wa = std::exp(a - merged), wb = std::exp(b - merged);
      for (int64_t e = 0; e < head_dim; ++e) o[e] = o[e] * wa + bo[e] * wb;
      a = merged;
    }
  }
}

}  // namespace loom::kernels::cpu
