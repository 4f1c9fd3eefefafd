// Block-scaled FP8 GEMM on Hopper's fp8 tensor cores (wgmma, sm_90a).
// CTA tile 128 x 128 with K blocks of 128 (one scale block per step); two
// warpgroups each own 64 rows and issue four m64n128k32 e4m3 wgmma per K
// block into a fresh fp32 partial accumulator, then promote it with
// a_scale(row) * b_scale(col) into the running fp32 total (DeepSeek-V3's
// promotion every 128 of K). Operands arrive by cp.async in a 4-stage ring,
// stored in the 128-byte-swizzled K-major layout the wgmma descriptors name.
//
// Not yet run on a device (see kernels/RESULTS.md); the mma.sync path
// (fp8_gemm_mma.cu) is the default until tests/gpu passes on this one.
#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/fp8/fp8_gemm_common.cuh"
#include "kernels/cuda/hd/tile_math.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kTile = 128;
constexpr int kStages = 4;
constexpr int kThreads = 256;                  // two consumer warpgroups
constexpr int kOperandBytes = kTile * kTile;   // one fp8 operand tile
constexpr int kStageBytes = 33 * 1024;         // A, B, then 128 + 128 scales; 1024-aligned
constexpr int kSmemBytes = kStages * kStageBytes + 1024;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOOM_HAVE_WGMMA 1
#endif

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, rows of 128
// bytes, 8-row groups 1024 bytes apart (SBO); LBO is unused in this mode.
__device__ __forceinline__ uint64_t Desc128B(const void* smem) {
  const uint64_t addr = SmemAddr(smem);
  uint64_t desc = (addr & 0x3ffffu) >> 4;
  desc |= static_cast<uint64_t>(1) << 16;
  desc |= static_cast<uint64_t>(1024 >> 4) << 32;
  desc |= static_cast<uint64_t>(1) << 62;
  return desc;
}

__device__ __forceinline__ void WgmmaFence() {
#ifdef LOOM_HAVE_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#ifdef LOOM_HAVE_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaWaitAll() {
#ifdef LOOM_HAVE_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// Pins the accumulator registers at this point of the program: the compiler
// must not move reads of wgmma results above the wait (or writes below the
// next issue), since it does not know the instruction is asynchronous.
__device__ __forceinline__ void FenceOperands(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// d (64 fp32 per thread) = (accumulate ? d : 0) + A(64 x 32) * B(128 x 32)^T.
__device__ __forceinline__ void WgmmaM64N128K32(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#ifdef LOOM_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a: refuse loudly rather than return zeros
#endif
}

// One stage: A rows m0.., B rows n0.. of K block kb, swizzled (16-byte chunk c
// of row r at chunk c ^ (r % 8)), then the 128 A scales and (tile layout) the
// 128 B scales of the block.
__device__ __forceinline__ void LoadStage(unsigned char* stage, const Fp8GemmParams& p, int m0, int n0, int kb,
                                          int tid) {
#pragma unroll
  for (int i = 0; i < 2 * kOperandBytes / 16 / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int which = c / 1024, r = (c % 1024) / 8, ch = c % 8;
    const uint8_t* src = which == 0 ? p.a + static_cast<int64_t>(m0 + r) * p.k + kb * kTile + ch * 16
                                    : p.b + static_cast<int64_t>(n0 + r) * p.k + kb * kTile + ch * 16;
    CpAsync16(stage + which * kOperandBytes + SwizzledOffset8(r, ch * 16, kTile), src, true);
  }
  if (tid < 32) {
    CpAsync16(stage + 2 * kOperandBytes + tid * 16, p.a_scales + static_cast<int64_t>(kb) * p.m + m0 + tid * 4, true);
  } else if (tid < 64 && p.b_tile_scales) {
    const int t = tid - 32;
    CpAsync16(stage + 2 * kOperandBytes + 512 + t * 16, p.b_scales + static_cast<int64_t>(kb) * p.n + n0 + t * 4, true);
  }
}

__global__ void __launch_bounds__(kThreads, 1) Fp8GemmWgmmaKernel(const Fp8GemmParams p) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int tid = threadIdx.x, wg = tid / 128, warp_in_wg = (tid % 128) / 32, lane = tid % 32;
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  const int k_blocks = p.k / kTile;

  float total[64], part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) total[i] = part[i] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_blocks) LoadStage(smem + s * kStageBytes, p, m0, n0, s, tid);
    CpAsyncCommit();
  }
  for (int kb = 0; kb < k_blocks; ++kb) {
    CpAsyncWait<kStages - 2>();
    FenceProxyAsync();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
    __syncthreads();
    {
      const int next = kb + kStages - 1;
      if (next < k_blocks) LoadStage(smem + (next % kStages) * kStageBytes, p, m0, n0, next, tid);
      CpAsyncCommit();
    }
    const unsigned char* stage = smem + (kb % kStages) * kStageBytes;
    const unsigned char* a_tile = stage + wg * 64 * kTile;
    const unsigned char* b_tile = stage + kOperandBytes;
    FenceOperands(part);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kTile / 32; ++kk)
      WgmmaM64N128K32(part, Desc128B(a_tile + kk * 32), Desc128B(b_tile + kk * 32), kk > 0 ? 1 : 0);
    WgmmaCommit();
    WgmmaWaitAll();
    FenceOperands(part);

    // Promotion. Thread layout of the m64n128 accumulator: warp w of the
    // warpgroup holds rows 16w + lane/4 (+8); element 4j + e is column
    // 8j + 2(lane%4) + (e%2), row offset 8 * (e/2).
    const float* s_sa = reinterpret_cast<const float*>(stage + 2 * kOperandBytes);
    const float* s_sb = s_sa + kTile;
    const int row_local = wg * 64 + warp_in_wg * 16 + lane / 4;
    const float sa0 = s_sa[row_local], sa1 = s_sa[row_local + 8];
    const float sb_block = p.b_tile_scales ? 0.f : p.b_scales[static_cast<int64_t>(n0 / kTile) * k_blocks + kb];
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float sb = p.b_tile_scales ? s_sb[8 * j + 2 * (lane % 4) + (e % 2)] : sb_block;
        total[4 * j + e] = fmaf(part[4 * j + e], (e < 2 ? sa0 : sa1) * sb, total[4 * j + e]);
      }
  }
  CpAsyncWait<0>();

  const int row = m0 + wg * 64 + warp_in_wg * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = n0 + 8 * j + 2 * (lane % 4);
    StoreFp8GemmPair(p, row, col, total[4 * j], total[4 * j + 1]);
    StoreFp8GemmPair(p, row + 8, col, total[4 * j + 2], total[4 * j + 3]);
  }
}

}  // namespace

cudaError_t LaunchFp8GemmWgmma(const Fp8GemmParams& p, cudaStream_t stream) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(Fp8GemmWgmmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attr != cudaSuccess) return attr;
  dim3 grid(p.n / kTile, p.m / kTile);
  Fp8GemmWgmmaKernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace loom::kernels::cuda
