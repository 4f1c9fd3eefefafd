// Reference FP8 quantization (DeepSeek-V3 layout) and block-scaled GEMM: plain
// loops over the hd functions, the meaning of every layout the CUDA kernels
// produce and consume. std-only, header-only.
//
// Layouts (all row-major):
//  - Activation tiles (1 x 128 along the reduction dim): X [rows, cols] ->
//    codes [rows, cols] and scales [ceil(cols/128), rows] ("k-block major", so a
//    GEMM tile's 128 row scales of one k block are contiguous).
//  - Transposed activation tiles: codes of X^T [cols, rows], scales
//    [ceil(rows/128), cols]; identical to quantizing X^T as activations. This is
//    the operand layout the weight-gradient GEMM needs.
//  - Weight blocks (128 x 128): W [n, k] -> codes [n, k], scales
//    [ceil(n/128), ceil(k/128)]. The transposed variant quantizes W^T the same
//    way (the dgrad operand).
//  - GEMM: D[m, n] = sum_kb sa(m, kb) * sb(n, kb) * sum_{k in kb} A[m, k] B[n, k]
//    (both operands K-major, "NT"), partial sums promoted every 128 of K, bf16 out.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/hd/bf16_bits.h"
#include "kernels/cuda/hd/fp8_e4m3.h"
#include "kernels/cuda/hd/tile_math.h"

namespace loom::kernels::cuda::reference {

struct Fp8Tensor {
  int rows = 0, cols = 0;          // of the codes
  std::vector<uint8_t> codes;      // [rows, cols]
  std::vector<float> scales;       // layout per the quantizer
};

// x is [rows, cols]; transpose quantizes x^T.
inline Fp8Tensor QuantizeActivation(const float* x, int rows, int cols, bool transpose) {
  Fp8Tensor t;
  t.rows = transpose ? cols : rows;
  t.cols = transpose ? rows : cols;
  auto at = [&](int r, int c) { return transpose ? x[static_cast<int64_t>(c) * cols + r] : x[static_cast<int64_t>(r) * cols + c]; };
  int kb_count = CeilDiv(t.cols, kFp8Tile);
  t.codes.resize(static_cast<size_t>(t.rows) * t.cols);
  t.scales.resize(static_cast<size_t>(kb_count) * t.rows);
  for (int r = 0; r < t.rows; ++r)
    for (int kb = 0; kb < kb_count; ++kb) {
      int c1 = std::min(t.cols, (kb + 1) * kFp8Tile);
      float amax = 0;
      for (int c = kb * kFp8Tile; c < c1; ++c) amax = std::fmax(amax, std::fabs(at(r, c)));
      Fp8Scale s = ComputeFp8Scale(amax);
      t.scales[static_cast<size_t>(kb) * t.rows + r] = s.scale;
      for (int c = kb * kFp8Tile; c < c1; ++c)
        t.codes[static_cast<size_t>(r) * t.cols + c] = QuantizeE4m3(at(r, c), s.inv_scale);
    }
  return t;
}

// w is [n, k]; transpose quantizes w^T.
inline Fp8Tensor QuantizeWeight(const float* w, int n, int k, bool transpose) {
  Fp8Tensor t;
  t.rows = transpose ? k : n;
  t.cols = transpose ? n : k;
  auto at = [&](int r, int c) { return transpose ? w[static_cast<int64_t>(c) * k + r] : w[static_cast<int64_t>(r) * k + c]; };
  int rb_count = CeilDiv(t.rows, kFp8Tile), cb_count = CeilDiv(t.cols, kFp8Tile);
  t.codes.resize(static_cast<size_t>(t.rows) * t.cols);
  t.scales.resize(static_cast<size_t>(rb_count) * cb_count);
  for (int rb = 0; rb < rb_count; ++rb)
    for (int cb = 0; cb < cb_count; ++cb) {
      int r1 = std::min(t.rows, (rb + 1) * kFp8Tile), c1 = std::min(t.cols, (cb + 1) * kFp8Tile);
      float amax = 0;
      for (int r = rb * kFp8Tile; r < r1; ++r)
        for (int c = cb * kFp8Tile; c < c1; ++c) amax = std::fmax(amax, std::fabs(at(r, c)));
      Fp8Scale s = ComputeFp8Scale(amax);
      t.scales[static_cast<size_t>(rb) * cb_count + cb] = s.scale;
      for (int r = rb * kFp8Tile; r < r1; ++r)
        for (int c = cb * kFp8Tile; c < c1; ++c)
          t.codes[static_cast<size_t>(r) * t.cols + c] = QuantizeE4m3(at(r, c), s.inv_scale);
    }
  return t;
}

enum class Fp8BScales { kBlock128x128, kTile1x128 };

// Scale of B's row n in k block kb, per its layout.
inline float BScale(const Fp8Tensor& b, Fp8BScales mode, int n, int kb) {
  if (mode == Fp8BScales::kTile1x128) return b.scales[static_cast<size_t>(kb) * b.rows + n];
  return b.scales[static_cast<size_t>(n / kFp8Tile) * CeilDiv(b.cols, kFp8Tile) + kb];
}

// D [a.rows, b.rows] as fp32 before the final bf16 rounding; a.cols == b.cols.
inline std::vector<float> Fp8GemmFloat(const Fp8Tensor& a, const Fp8Tensor& b, Fp8BScales mode) {
  int m = a.rows, n = b.rows, k = a.cols, kb_count = CeilDiv(k, kFp8Tile);
  std::vector<float> a_val(a.codes.size()), b_val(b.codes.size());
  for (size_t i = 0; i < a.codes.size(); ++i) a_val[i] = E4m3ToFloat(a.codes[i]);
  for (size_t i = 0; i < b.codes.size(); ++i) b_val[i] = E4m3ToFloat(b.codes[i]);
  std::vector<float> d(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int kb = 0; kb < kb_count; ++kb) {
        double partial = 0;
        for (int p = kb * kFp8Tile; p < std::min(k, (kb + 1) * kFp8Tile); ++p)
          partial += static_cast<double>(a_val[static_cast<size_t>(i) * k + p]) * b_val[static_cast<size_t>(j) * k + p];
        acc += partial * a.scales[static_cast<size_t>(kb) * m + i] * BScale(b, mode, j, kb);
      }
      d[static_cast<size_t>(i) * n + j] = static_cast<float>(acc);
    }
  return d;
}

}  // namespace loom::kernels::cuda::reference
