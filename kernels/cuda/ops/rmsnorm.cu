// RMSNorm forward and backward: one CTA (256 threads) per row, each thread
// owning up to 8 vectors of 8 columns, a block reduction for the row
// statistic. The weight gradient is deterministic: every CTA keeps its
// columns' partial sums in registers over its rows (fixed order), writes them
// to the workspace, and a second kernel adds the partials in CTA order.
#include "kernels/cuda/ops/fused_ops.h"
#include "kernels/cuda/ops/vec.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecs = 8;  // dim <= 256 * 8 * 8 = 16384
constexpr int kBwdBlocks = 264;

template <typename T>
__global__ void __launch_bounds__(kThreads) RmsNormFwdKernel(const T* __restrict__ x, const float* __restrict__ w,
                                                             int64_t rows, int dim, float eps, T* __restrict__ y,
                                                             float* __restrict__ rstd) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * dim;
    float v[kMaxVecs][8];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxVecs; ++j) {
      const int c = (j * kThreads + threadIdx.x) * 8;
      if (c < dim) {
        Load8(xr + c, v[j]);
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += v[j][e] * v[j][e];
      }
    }
    const float rs = 1.0f / sqrtf(BlockSum(ss, scratch) / dim + eps);
#pragma unroll
    for (int j = 0; j < kMaxVecs; ++j) {
      const int c = (j * kThreads + threadIdx.x) * 8;
      if (c < dim) {
        float wv[8], out[8];
        Load8(w + c, wv);
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = v[j][e] * rs * wv[e];
        Store8(y + r * dim + c, out);
      }
    }
    if (threadIdx.x == 0) rstd[r] = rs;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) RmsNormBwdKernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                             const float* __restrict__ w, const float* __restrict__ rstd,
                                                             int64_t rows, int dim, T* __restrict__ dx,
                                                             bool accumulate_dx, float* __restrict__ partial) {
  __shared__ float scratch[32];
  float dw[kMaxVecs][8];
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) dw[j][e] = 0.f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float rs = rstd[r];
    float gx = 0.f;  // sum(dy * w * x)
#pragma unroll
    for (int j = 0; j < kMaxVecs; ++j) {
      const int c = (j * kThreads + threadIdx.x) * 8;
      if (c < dim) {
        float xv[8], gv[8], wv[8];
        Load8(x + r * dim + c, xv);
        Load8(dy + r * dim + c, gv);
        Load8(w + c, wv);
#pragma unroll
        for (int e = 0; e < 8; ++e) gx += gv[e] * wv[e] * xv[e];
      }
    }
    const float coef = BlockSum(gx, scratch) * rs * rs * rs / dim;
#pragma unroll
    for (int j = 0; j < kMaxVecs; ++j) {
      const int c = (j * kThreads + threadIdx.x) * 8;
      if (c < dim) {
        float xv[8], gv[8], wv[8], out[8];
        Load8(x + r * dim + c, xv);
        Load8(dy + r * dim + c, gv);
        Load8(w + c, wv);
        if (accumulate_dx) Load8(dx + r * dim + c, out);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float d = rs * gv[e] * wv[e] - xv[e] * coef;
          out[e] = accumulate_dx ? out[e] + d : d;
          dw[j][e] += gv[e] * xv[e] * rs;
        }
        Store8(dx + r * dim + c, out);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int c = (j * kThreads + threadIdx.x) * 8;
    if (c < dim) Store8(partial + static_cast<int64_t>(blockIdx.x) * dim + c, dw[j]);
  }
}

__global__ void RmsNormReduceDw(const float* __restrict__ partial, int blocks, int dim, float* __restrict__ dw) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  float s = 0.f;
  for (int b = 0; b < blocks; ++b) s += partial[static_cast<int64_t>(b) * dim + c];
  dw[c] += s;
}

bool RmsArgsOk(const void* a, const void* b, int64_t rows, int64_t dim) {
  return a && b && rows >= 1 && dim >= 8 && dim % 8 == 0 && dim <= kThreads * kMaxVecs * 8 && IsAligned16(a) &&
         IsAligned16(b);
}

int BwdBlocks(int64_t rows) { return static_cast<int>(rows < kBwdBlocks ? rows : kBwdBlocks); }

}  // namespace

size_t RmsNormBackwardWorkspaceBytes(int64_t dim) { return static_cast<size_t>(kBwdBlocks) * dim * sizeof(float); }

template <typename T>
cudaError_t RmsNormForward(const T* x, const float* weight, int64_t rows, int64_t dim, float eps, T* y, float* rstd,
                           cudaStream_t stream) {
  if (!RmsArgsOk(x, y, rows, dim) || !IsAligned16(weight) || rstd == nullptr) return cudaErrorInvalidValue;
  const int grid = static_cast<int>(rows < 65535 ? rows : 65535);
  RmsNormFwdKernel<T><<<grid, kThreads, 0, stream>>>(x, weight, rows, static_cast<int>(dim), eps, y, rstd);
  return cudaGetLastError();
}

template <typename T>
cudaError_t RmsNormBackward(const T* d_y, const T* x, const float* weight, const float* rstd, int64_t rows,
                            int64_t dim, T* dx, bool accumulate_dx, float* d_weight, void* workspace,
                            cudaStream_t stream) {
  if (!RmsArgsOk(d_y, x, rows, dim) || !IsAligned16(dx) || !IsAligned16(weight) || !IsAligned16(workspace) ||
      rstd == nullptr || d_weight == nullptr)
    return cudaErrorInvalidValue;
  const int blocks = BwdBlocks(rows);
  float* partial = static_cast<float*>(workspace);
  RmsNormBwdKernel<T><<<blocks, kThreads, 0, stream>>>(d_y, x, weight, rstd, rows, static_cast<int>(dim), dx,
                                                       accumulate_dx, partial);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  RmsNormReduceDw<<<static_cast<unsigned>((dim + 255) / 256), 256, 0, stream>>>(partial, blocks, static_cast<int>(dim),
                                                                                d_weight);
  return cudaGetLastError();
}

template cudaError_t RmsNormForward<float>(const float*, const float*, int64_t, int64_t, float, float*, float*,
                                           cudaStream_t);
template cudaError_t RmsNormForward<__nv_bfloat16>(const __nv_bfloat16*, const float*, int64_t, int64_t, float,
                                                   __nv_bfloat16*, float*, cudaStream_t);
template cudaError_t RmsNormBackward<float>(const float*, const float*, const float*, const float*, int64_t, int64_t,
                                            float*, bool, float*, void*, cudaStream_t);
template cudaError_t RmsNormBackward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, const float*,
                                                    const float*, int64_t, int64_t, __nv_bfloat16*, bool, float*,
                                                    void*, cudaStream_t);

}  // namespace loom::kernels::cuda
