// Block-scaled FP8 GEMM on mma.sync. Hopper's mma.sync has no fp8 variant, so
// each 128 x 128 fp8 tile is widened to fp16 in shared memory (exact: every
// e4m3 value is an fp16 value) and multiplied with m16n8k16 f16 mma into fp32
// partial sums, which are promoted with their two scales after every 128 of
// K. The portable path, and the check on the wgmma path; the fp8 tensor-core
// rate needs wgmma (fp8_gemm_wgmma.cu).
//
// CTA tile 128 x 128, 16 warps as 4 (m) x 4 (n), warp tile 32 x 32 (two
// accumulator sets, partial and promoted, must stay in registers); the fp8
// tiles of the next k block arrive by cp.async while this one is multiplied.
#include <cuda_fp16.h>

#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/fp8/fp8_gemm_common.cuh"
#include "kernels/cuda/hd/mma_layout.h"
#include "kernels/cuda/hd/tile_math.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kTile = 128;
constexpr int kThreads = 512;
// Staging: 2 x (A, B) fp8 tiles; widened: A, B fp16 tiles.
constexpr int kStageBytes = 2 * kTile * kTile;
constexpr int kSmemBytes = 2 * kStageBytes + 2 * kTile * kTile * 2 + 2 * kTile * 4;

__device__ __forceinline__ void LoadFp8Tiles(uint8_t* stage, const Fp8GemmParams& p, int m0, int n0, int kb,
                                             int tid) {
  // 2 x 1024 chunks of 16 bytes; chunk c: row c / 8, 16-byte column c % 8.
#pragma unroll
  for (int i = 0; i < 2048 / kThreads; ++i) {
    const int c = tid + i * kThreads;  // 0 .. 2047
    const int which = c / 1024, r = (c % 1024) / 8, ch = c % 8;
    const uint8_t* src = which == 0 ? p.a + static_cast<int64_t>(m0 + r) * p.k + kb * kTile + ch * 16
                                    : p.b + static_cast<int64_t>(n0 + r) * p.k + kb * kTile + ch * 16;
    CpAsync16(stage + which * kTile * kTile + r * kTile + ch * 16, src, true);
  }
}

// Widens the staged fp8 tiles into the swizzled fp16 tiles ([row][k]).
__device__ __forceinline__ void WidenTiles(const uint8_t* stage, __half* wide, int tid) {
#pragma unroll 1
  for (int i = 0; i < 2048 / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int which = c / 1024, r = (c % 1024) / 8, ch = c % 8;
    const uint4 raw = *reinterpret_cast<const uint4*>(stage + which * kTile * kTile + r * kTile + ch * 16);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t h[8];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      h[2 * w] = E4m3x2ToF16x2(static_cast<uint16_t>(words[w] & 0xffffu));
      h[2 * w + 1] = E4m3x2ToF16x2(static_cast<uint16_t>(words[w] >> 16));
    }
    __half* dst = wide + which * kTile * kTile;
    // 16 codes -> two 8-element fp16 chunks at columns ch*16 and ch*16 + 8.
    *reinterpret_cast<uint4*>(dst + SwizzledOffset16(r, ch * 16, kTile)) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4*>(dst + SwizzledOffset16(r, ch * 16 + 8, kTile)) = make_uint4(h[4], h[5], h[6], h[7]);
  }
}

__global__ void __launch_bounds__(kThreads) Fp8GemmMmaKernel(const Fp8GemmParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint8_t* stages = smem_raw;
  __half* wide = reinterpret_cast<__half*>(smem_raw + 2 * kStageBytes);
  const __half* wide_a = wide;
  const __half* wide_b = wide + kTile * kTile;
  // This k block's scales: staged in shared memory so the promotion does not
  // hold 64-bit global addresses in registers across the mma loop.
  float* s_sa = reinterpret_cast<float*>(smem_raw + 2 * kStageBytes + 2 * kTile * kTile * 2);
  float* s_sb = s_sa + kTile;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  const int wm = (warp / 4) * 32, wn = (warp % 4) * 32;
  const int k_blocks = p.k / kTile;

  float total[2][4][4], part[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) total[i][j][e] = 0.f;

  LoadFp8Tiles(stages, p, m0, n0, 0, tid);
  CpAsyncCommit();
  const RowCol a_rc = LdmatrixA(lane), b_rc = LdmatrixBNk(lane);
  for (int kb = 0; kb < k_blocks; ++kb) {
    CpAsyncWait<0>();
    __syncthreads();  // stage kb landed; previous mma reads of `wide` are done
    if (kb + 1 < k_blocks) {
      LoadFp8Tiles(stages + ((kb + 1) & 1) * kStageBytes, p, m0, n0, kb + 1, tid);
      CpAsyncCommit();
    }
    WidenTiles(stages + (kb & 1) * kStageBytes, wide, tid);
    if (tid < kTile) s_sa[tid] = p.a_scales[static_cast<int64_t>(kb) * p.m + m0 + tid];
    else if (tid < 2 * kTile) s_sb[tid - kTile] = Fp8BScale(p, n0 + tid - kTile, kb);
    __syncthreads();

#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[i][j][e] = 0.f;
#pragma unroll 1
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t b[2][4];
#pragma unroll
      for (int np = 0; np < 2; ++np)
        Ldmatrix4(b[np], wide_b + SwizzledOffset16(wn + np * 16 + b_rc.row, kk * 16 + b_rc.col, kTile));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        uint32_t a[4];
        Ldmatrix4(a, wide_a + SwizzledOffset16(wm + mt * 16 + a_rc.row, kk * 16 + a_rc.col, kTile));
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) MmaF16(part[mt][nt], a, b[nt / 2][2 * (nt % 2)], b[nt / 2][2 * (nt % 2) + 1]);
      }
    }

    // Promotion: total += a_scale(row) * b_scale(col) * partial.
    float sb[4][2];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) sb[nt][e] = s_sb[wn + nt * 8 + MmaAccElement(lane, e).col];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sa = s_sa[wm + mt * 16 + lane / 4 + 8 * h];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) total[mt][nt][2 * h + e] = fmaf(part[mt][nt][2 * h + e], sa * sb[nt][e], total[mt][nt][2 * h + e]);
      }
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + wm + mt * 16 + lane / 4 + 8 * h;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = n0 + wn + nt * 8 + 2 * (lane % 4);
        StoreFp8GemmPair(p, row, col, total[mt][nt][2 * h], total[mt][nt][2 * h + 1]);
      }
    }
}

}  // namespace

cudaError_t LaunchFp8GemmMma(const Fp8GemmParams& p, cudaStream_t stream) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(Fp8GemmMmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attr != cudaSuccess) return attr;
  dim3 grid(p.n / kTile, p.m / kTile);
  Fp8GemmMmaKernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace loom::kernels::cuda
