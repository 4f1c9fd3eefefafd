#include "kernels/cpu/fp8_quantize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/hd/fp8_e4m3.h"

namespace loom::kernels::cpu {
namespace {

using cuda::ComputeFp8Scale;
using cuda::E4m3ToFloat;
using cuda::Fp8Scale;
using cuda::kFp8Tile;
using cuda::QuantizeE4m3;

// e4m3 -> fp32 is exact; the product with the scale rounds once (2^-24
// relative, far below e4m3's 2^-4 step). The GPU applies the scales to each
// 128-long partial sum instead, so emulation and GPU agree to fp32 rounding,
// not bit for bit.
inline float RoundTrip(float x, const Fp8Scale& s) {
  return E4m3ToFloat(QuantizeE4m3(x, s.inv_scale)) * s.scale;
}

// fmax ignores a NaN operand; a NaN in the data then keeps a finite scale and
// stays NaN itself, as the GPU's max reduction does.
inline float AbsMax(float acc, float x) { return std::fmax(acc, std::fabs(x)); }

void RowTiles(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x + r * ld;
    float* dst = out + r * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += kFp8Tile) {
      const int64_t c1 = std::min(cols, c0 + kFp8Tile);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = AbsMax(amax, src[c]);
      const Fp8Scale s = ComputeFp8Scale(amax);
      for (int64_t c = c0; c < c1; ++c) dst[c] = RoundTrip(src[c], s);
    }
  }
}

void ColumnTiles(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out) {
  const int64_t row_tiles = (rows + kFp8Tile - 1) / kFp8Tile;
#pragma omp parallel for schedule(static)
  for (int64_t rt = 0; rt < row_tiles; ++rt) {
    const int64_t r0 = rt * kFp8Tile, r1 = std::min(rows, r0 + kFp8Tile);
    // Column maxima accumulated row by row, so the reads stay contiguous.
    std::vector<float> amax(static_cast<size_t>(cols), 0.0f);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < cols; ++c) amax[c] = AbsMax(amax[c], x[r * ld + c]);
    std::vector<Fp8Scale> scale(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) scale[c] = ComputeFp8Scale(amax[c]);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = RoundTrip(x[r * ld + c], scale[c]);
  }
}

void Blocks(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out) {
  const int64_t row_blocks = (rows + kFp8Tile - 1) / kFp8Tile;
  const int64_t col_blocks = (cols + kFp8Tile - 1) / kFp8Tile;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t rb = 0; rb < row_blocks; ++rb) {
    for (int64_t cb = 0; cb < col_blocks; ++cb) {
      const int64_t r0 = rb * kFp8Tile, r1 = std::min(rows, r0 + kFp8Tile);
      const int64_t c0 = cb * kFp8Tile, c1 = std::min(cols, c0 + kFp8Tile);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = AbsMax(amax, x[r * ld + c]);
      const Fp8Scale s = ComputeFp8Scale(amax);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) out[r * cols + c] = RoundTrip(x[r * ld + c], s);
    }
  }
}

}  // namespace

void Fp8RoundTrip(const float* x, int64_t rows, int64_t cols, int64_t ld, Fp8Grouping grouping,
                  float* out) {
  if (rows <= 0 || cols <= 0) return;
  switch (grouping) {
    case Fp8Grouping::kRowTiles:
      RowTiles(x, rows, cols, ld, out);
      return;
    case Fp8Grouping::kColumnTiles:
      ColumnTiles(x, rows, cols, ld, out);
      return;
    case Fp8Grouping::kBlocks:
      Blocks(x, rows, cols, ld, out);
      return;
  }
}

}  // namespace loom::kernels::cpu
