// FP8 quantizers: a warp per 1 x 128 activation tile; a transposing variant
// that stages 128 x 32 tiles in shared memory so both its reads and its
// writes are coalesced; a CTA per 128 x 128 weight block. The codes come from
// the hardware conversion (cvt.rn.satfinite.e4m3x2.f32), checked against the
// host FloatToE4m3 by tests/gpu.
#include <cuda_fp8.h>

#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/fp8/fp8.h"
#include "kernels/cuda/hd/fp8_e4m3.h"
#include "kernels/cuda/hd/tile_math.h"

namespace loom::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(bf16 x) { return __bfloat162float(x); }

__device__ __forceinline__ uint8_t HwE4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// grid.x = rows * ceil(cols / 128) / 8 warps; each lane takes 4 consecutive
// elements of the tile. T: bf16 or fp32 input.
template <typename T>
__global__ void QuantActKernel(const T* __restrict__ x, int rows, int cols, uint8_t* __restrict__ codes,
                               float* __restrict__ scales) {
  const int k_blocks = CeilDiv(cols, kFp8Tile);
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (tile >= static_cast<int64_t>(rows) * k_blocks) return;
  const int lane = threadIdx.x % 32;
  const int row = static_cast<int>(tile / k_blocks), kb = static_cast<int>(tile % k_blocks);
  const int c0 = kb * kFp8Tile + lane * 4;
  const T* src = x + static_cast<int64_t>(row) * cols;
  float v[4];
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = c0 + j < cols ? ToFloat(src[c0 + j]) : 0.f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  amax = WarpMax(amax);
  const Fp8Scale s = ComputeFp8Scale(amax);
  uint8_t* dst = codes + static_cast<int64_t>(row) * cols;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (c0 + j < cols) dst[c0 + j] = HwE4m3(MulRn(v[j], s.inv_scale));
  if (lane == 0) scales[static_cast<int64_t>(kb) * rows + row] = s.scale;
}

// Transposed: output row c (input column) quantized along the input rows.
// CTA: 128 input rows x 32 input columns, 256 threads.
template <typename T>
__global__ void QuantActTransposedKernel(const T* __restrict__ x, int rows, int cols,
                                         uint8_t* __restrict__ codes, float* __restrict__ scales) {
  __shared__ float tile[kFp8Tile][33];
  const int rb = blockIdx.y, c0 = blockIdx.x * 32;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int r = warp; r < kFp8Tile; r += 8) {
    const int row = rb * kFp8Tile + r, col = c0 + lane;
    tile[r][lane] = row < rows && col < cols ? ToFloat(x[static_cast<int64_t>(row) * cols + col]) : 0.f;
  }
  __syncthreads();
  for (int cc = warp; cc < 32; cc += 8) {
    const int col = c0 + cc;
    float v[4];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[j] = tile[lane * 4 + j][cc];
      amax = fmaxf(amax, fabsf(v[j]));
    }
    amax = WarpMax(amax);
    if (col >= cols) continue;  // uniform across the warp
    const Fp8Scale s = ComputeFp8Scale(amax);
    uint8_t* dst = codes + static_cast<int64_t>(col) * rows + rb * kFp8Tile + lane * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (rb * kFp8Tile + lane * 4 + j < rows) dst[j] = HwE4m3(MulRn(v[j], s.inv_scale));
    if (lane == 0) scales[static_cast<int64_t>(rb) * cols + col] = s.scale;
  }
}

// One CTA (256 threads) per 128 x 128 block of w [n, k].
template <typename T>
__global__ void QuantWeightKernel(const T* __restrict__ w, int n, int k, bool transpose,
                                  uint8_t* __restrict__ codes, float* __restrict__ scales) {
  __shared__ uint8_t q[kFp8Tile][kFp8Tile + 4];
  __shared__ float warp_max[8];
  const int nb = blockIdx.y, kb = blockIdx.x;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int r1 = MinInt(kFp8Tile, n - nb * kFp8Tile), c1 = MinInt(kFp8Tile, k - kb * kFp8Tile);
  float amax = 0.f;
  for (int i = tid; i < kFp8Tile * kFp8Tile; i += 256) {
    const int r = i / kFp8Tile, c = i % kFp8Tile;
    if (r < r1 && c < c1)
      amax = fmaxf(amax, fabsf(ToFloat(w[static_cast<int64_t>(nb * kFp8Tile + r) * k + kb * kFp8Tile + c])));
  }
  amax = WarpMax(amax);
  if (lane == 0) warp_max[warp] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, warp_max[i]);
  const Fp8Scale s = ComputeFp8Scale(amax);
  for (int i = tid; i < kFp8Tile * kFp8Tile; i += 256) {
    const int r = i / kFp8Tile, c = i % kFp8Tile;
    if (r < r1 && c < c1)
      q[r][c] = HwE4m3(MulRn(ToFloat(w[static_cast<int64_t>(nb * kFp8Tile + r) * k + kb * kFp8Tile + c]), s.inv_scale));
  }
  __syncthreads();
  for (int i = tid; i < kFp8Tile * kFp8Tile; i += 256) {
    const int r = i / kFp8Tile, c = i % kFp8Tile;  // output-major
    if (!transpose) {
      if (r < r1 && c < c1) codes[static_cast<int64_t>(nb * kFp8Tile + r) * k + kb * kFp8Tile + c] = q[r][c];
    } else {
      // output row = input column kb*128 + r, output column = input row nb*128 + c
      if (r < c1 && c < r1) codes[static_cast<int64_t>(kb * kFp8Tile + r) * n + nb * kFp8Tile + c] = q[c][r];
    }
  }
  if (tid == 0) {
    if (!transpose)
      scales[static_cast<int64_t>(nb) * CeilDiv(k, kFp8Tile) + kb] = s.scale;
    else
      scales[static_cast<int64_t>(kb) * CeilDiv(n, kFp8Tile) + nb] = s.scale;
  }
}

template <typename T>
cudaError_t LaunchQuantWeight(const T* w, int n, int k, bool transpose, uint8_t* codes, float* scales,
                              cudaStream_t stream) {
  if (w == nullptr || codes == nullptr || scales == nullptr || n < 1 || k < 1) return cudaErrorInvalidValue;
  dim3 grid(CeilDiv(k, kFp8Tile), CeilDiv(n, kFp8Tile));
  QuantWeightKernel<T><<<grid, 256, 0, stream>>>(w, n, k, transpose, codes, scales);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchQuantAct(const T* x, int rows, int cols, bool transpose, uint8_t* codes, float* scales,
                           cudaStream_t stream) {
  if (x == nullptr || codes == nullptr || scales == nullptr || rows < 1 || cols < 1) return cudaErrorInvalidValue;
  if (!transpose) {
    const int64_t tiles = static_cast<int64_t>(rows) * CeilDiv(cols, kFp8Tile);
    QuantActKernel<T><<<static_cast<unsigned>((tiles + 7) / 8), 256, 0, stream>>>(x, rows, cols, codes, scales);
  } else {
    dim3 grid(CeilDiv(cols, 32), CeilDiv(rows, kFp8Tile));
    QuantActTransposedKernel<T><<<grid, 256, 0, stream>>>(x, rows, cols, codes, scales);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t QuantizeActivationFp8(const bf16* x, int rows, int cols, bool transpose, uint8_t* codes,
                                  float* scales, cudaStream_t stream) {
  return LaunchQuantAct(x, rows, cols, transpose, codes, scales, stream);
}

cudaError_t QuantizeActivationFp8(const float* x, int rows, int cols, bool transpose, uint8_t* codes,
                                  float* scales, cudaStream_t stream) {
  return LaunchQuantAct(x, rows, cols, transpose, codes, scales, stream);
}

cudaError_t QuantizeWeightFp8(const float* w, int n, int k, bool transpose, uint8_t* codes, float* scales,
                              cudaStream_t stream) {
  return LaunchQuantWeight(w, n, k, transpose, codes, scales, stream);
}

cudaError_t QuantizeWeightFp8(const bf16* w, int n, int k, bool transpose, uint8_t* codes, float* scales,
                              cudaStream_t stream) {
  return LaunchQuantWeight(w, n, k, transpose, codes, scales, stream);
}

}  // namespace loom::kernels::cuda
