// How CudaOps' fp8 recipe feeds one GemmScope::kLinear Gemm to the FP8
// kernels of kernels/cuda/fp8: which quantizer each operand goes through,
// with which transpose flag, on which zero-padded shape, and the layout of
// B's scales. Pure logic, std-only, so the plan is tested against the CPU
// emulation and the FP8 reference on machines without a GPU
// (tests/gpu/cuda_ops_recipes_test.cc); cuda_gemm_fp8.cc executes it.
//
// The FP8 GEMM is "NT": codes A [m, k] and B [n, k], both K-major, with A's
// scales 1 x 128 tiles along k and B's either 128 x 128 blocks or 1 x 128
// tiles. The operands' roles follow GemmScope (kernels/ops.h), as in the CPU
// emulation (kernels/cpu/fp8_emulation_ops.cc):
//  - A is an activation, tiled along the reduction dimension;
//  - B is the weight when A is not transposed (forward, dgrad), blocked as
//    STORED however the GEMM reads it, and otherwise (wgrad) an activation
//    tiled along the reduction (token) dimension like A.
// Both quantizers take a dense stored matrix [rows, cols] and produce codes
// [rows, cols], or with `transpose` codes [cols, rows]: the transpose flag is
// set exactly when the stored matrix has k as its row index.
//
// Padding: the kernels need m, n, k to be multiples of 128 (>= 128). Each
// stored operand is zero-padded to multiples of 128 first; a zero changes no
// tile's or block's amax, so the padded operands quantize to the values the
// CPU emulation's short tiles and blocks hold, and padded rows, columns and
// reduction steps contribute nothing to the [m, n] result.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace loom::kernels::cuda {

struct Fp8OperandPlan {
  int64_t rows = 0, cols = 0;                // the stored matrix (caller's leading dimension)
  int64_t padded_rows = 0, padded_cols = 0;  // what the quantizer reads, densely
  bool weight = false;     // QuantizeWeightFp8 (128 x 128) vs QuantizeActivationFp8 (1 x 128)
  bool transpose = false;  // the quantizer's transpose flag
};

struct Fp8GemmPlan {
  // False when a padded dimension exceeds the kernels (m > 128 * 65535 rows,
  // or n, k beyond int): the recipe runs that GEMM in bf16 instead.
  bool supported = false;
  int64_t m = 0, n = 0, k = 0;  // padded GEMM shape
  Fp8OperandPlan a, b;
  bool b_tile_scales = false;  // Fp8BScales::kTile1x128, else kBlock128x128
};

inline int64_t PadToFp8Tile(int64_t x) { return (x + 127) / 128 * 128; }

inline Fp8GemmPlan PlanFp8Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n,
                               int64_t k) {
  const bool ta = trans_a == Transpose::kYes, tb = trans_b == Transpose::kYes;
  Fp8GemmPlan p;
  p.m = PadToFp8Tile(m);
  p.n = PadToFp8Tile(n);
  p.k = PadToFp8Tile(k);
  p.supported = m >= 1 && n >= 1 && k >= 1 && p.m / 128 <= 65535 && p.n <= 0x7fffffff &&
                p.k <= 0x7fffffff;
  // A: stored [m, k] or, transposed, [k, m]; tiles along k either way.
  p.a = ta ? Fp8OperandPlan{k, m, p.k, p.m, false, true}
           : Fp8OperandPlan{m, k, p.m, p.k, false, false};
  // B: stored [n, k] when transposed, else [k, n].
  const bool weight = !ta;
  p.b = tb ? Fp8OperandPlan{n, k, p.n, p.k, weight, false}
           : Fp8OperandPlan{k, n, p.k, p.n, weight, true};
  p.b_tile_scales = !weight;
  return p;
}

}  // namespace loom::kernels::cuda
