// Shared by the two block-scaled FP8 GEMM kernels: argument checks and the
// per-(row, k block) scale lookup of the B operand. Device code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/fp8/fp8.h"
#include "kernels/cuda/hd/fp8_e4m3.h"

namespace loom::kernels::cuda {

struct Fp8GemmParams {
  const uint8_t* a;
  const float* a_scales;  // [k / 128, m]
  const uint8_t* b;
  const float* b_scales;  // [n / 128, k / 128] or [k / 128, n]
  __nv_bfloat16* d;  // bf16 output, or nullptr when d_f32 is set
  int m, n, k;
  bool b_tile_scales;
  float* d_f32 = nullptr;  // fp32 output instead of d
};

// Stores two adjacent output elements (row, col), (row, col + 1); col is even.
__device__ __forceinline__ void StoreFp8GemmPair(const Fp8GemmParams& p, int row, int col, float x0, float x1) {
  const int64_t offset = static_cast<int64_t>(row) * p.n + col;
  if (p.d_f32 != nullptr) {
    *reinterpret_cast<float2*>(p.d_f32 + offset) = make_float2(x0, x1);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(p.d + offset) = __floats2bfloat162_rn(x0, x1);
  }
}

__device__ __forceinline__ float Fp8BScale(const Fp8GemmParams& p, int col, int kb) {
  return p.b_tile_scales ? p.b_scales[static_cast<int64_t>(kb) * p.n + col]
                         : p.b_scales[static_cast<int64_t>(col / kFp8Tile) * (p.k / kFp8Tile) + kb];
}

cudaError_t LaunchFp8GemmMma(const Fp8GemmParams& p, cudaStream_t stream);
cudaError_t LaunchFp8GemmWgmma(const Fp8GemmParams& p, cudaStream_t stream);

}  // namespace loom::kernels::cuda
