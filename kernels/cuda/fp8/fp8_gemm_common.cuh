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
  __nv_bfloat16* d;
  int m, n, k;
  bool b_tile_scales;
};

__device__ __forceinline__ float Fp8BScale(const Fp8GemmParams& p, int col, int kb) {
  return p.b_tile_scales ? p.b_scales[static_cast<int64_t>(kb) * p.n + col]
                         : p.b_scales[static_cast<int64_t>(col / kFp8Tile) * (p.k / kFp8Tile) + kb];
}

cudaError_t LaunchFp8GemmMma(const Fp8GemmParams& p, cudaStream_t stream);
cudaError_t LaunchFp8GemmWgmma(const Fp8GemmParams& p, cudaStream_t stream);

}  // namespace loom::kernels::cuda
