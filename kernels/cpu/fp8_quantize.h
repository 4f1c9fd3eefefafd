// FP8 (e4m3) fake quantization of GEMM operands for the CPU emulation of the
// fp8 recipe: each value becomes e4m3(x / scale) * scale with DeepSeek-V3's
// fine-grained scales (scale = amax / 448 per tile or block, e4m3 round to
// nearest even with saturation), computed with the same host/device helpers
// the CUDA quantizers use (kernels/cuda/hd/fp8_e4m3.h), so the emulated
// operands hold exactly the values the GPU kernels would multiply.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// How a stored (row-major) matrix is cut into scaling groups. Tiles are
// aligned at row/column 0; the last tile or block of a dimension may be short.
enum class Fp8Grouping {
  kRowTiles,     // 1 x 128: 128 consecutive columns of one row (an activation
                 // whose reduction dimension is the stored column index)
  kColumnTiles,  // 128 x 1: 128 consecutive rows of one column (an activation
                 // whose reduction dimension is the stored row index)
  kBlocks,       // 128 x 128 (a weight, whatever way the GEMM reads it)
};

// out[r * cols + c] = fake-quantized x[r * ld + c] for a rows x cols matrix
// with leading dimension ld >= cols; out is dense (leading dimension cols).
// Deterministic and independent of the thread count.
void Fp8RoundTrip(const float* x, int64_t rows, int64_t cols, int64_t ld, Fp8Grouping grouping,
                  float* out);

}  // namespace loom::kernels::cpu
