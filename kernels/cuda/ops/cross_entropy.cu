// Cross-entropy fused with softmax: one CTA per row. Pass 1 keeps a running
// (max, sum) per thread (online softmax), merged across the block; pass 2
// writes grad_scale * (softmax - onehot), optionally over the logits
// themselves.
#include "kernels/cuda/ops/fused_ops.h"
#include "kernels/cuda/ops/vec.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 512;

// Merges two (max, sum-relative-to-max) pairs; empty pairs are (-inf, 0).
__device__ __forceinline__ void Merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) CrossEntropyKernel(const T* logits, const int32_t* __restrict__ targets,
                                                               int vocab, float grad_scale,
                                                               float* __restrict__ row_loss, T* d_logits) {
  __shared__ float sh_m[kThreads / 32], sh_s[kThreads / 32];
  const int64_t r = blockIdx.x;
  const T* x = logits + r * vocab;
  const int target = targets[r];
  float m = -INFINITY, s = 0.f;
  for (int c = threadIdx.x * 8; c < vocab; c += kThreads * 8) {
    float v[8];
    Load8(x + c, v);
    float bm = v[0];
#pragma unroll
    for (int e = 1; e < 8; ++e) bm = fmaxf(bm, v[e]);
    float bs = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) bs += __expf(v[e] - bm);
    Merge(m, s, bm, bs);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    Merge(m, s, m2, s2);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sh_m[warp] = m;
    sh_s[warp] = s;
  }
  __syncthreads();
  m = sh_m[0];
  s = sh_s[0];
  for (int i = 1; i < kThreads / 32; ++i) Merge(m, s, sh_m[i], sh_s[i]);
  const float lse = m + __logf(s);
  if (threadIdx.x == 0) row_loss[r] = target < 0 ? 0.f : lse - ToF32(x[target]);
  if (d_logits == nullptr) return;
  // Every thread has read the target logit's row above only through x[target]
  // in thread 0; when writing in place it must be read before it is overwritten.
  __syncthreads();
  T* dx = d_logits + r * vocab;
  for (int c = threadIdx.x * 8; c < vocab; c += kThreads * 8) {
    float v[8];
    Load8(x + c, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float p = target < 0 ? 0.f : __expf(v[e] - lse);
      v[e] = grad_scale * (p - (c + e == target ? 1.f : 0.f));
    }
    Store8(dx + c, v);
  }
}

}  // namespace

template <typename T>
cudaError_t CrossEntropy(const T* logits, const int32_t* targets, int64_t rows, int64_t vocab, float grad_scale,
                         float* row_loss, T* d_logits, cudaStream_t stream) {
  if (!logits || !targets || !row_loss || rows < 1 || rows > 0x7fffffff || vocab < 8 || vocab % 8 != 0 ||
      !IsAligned16(logits) || (d_logits && !IsAligned16(d_logits)))
    return cudaErrorInvalidValue;
  CrossEntropyKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, targets, static_cast<int>(vocab), grad_scale, row_loss, d_logits);
  return cudaGetLastError();
}

template cudaError_t CrossEntropy<float>(const float*, const int32_t*, int64_t, int64_t, float, float*, float*,
                                         cudaStream_t);
template cudaError_t CrossEntropy<__nv_bfloat16>(const __nv_bfloat16*, const int32_t*, int64_t, int64_t, float,
                                                 float*, __nv_bfloat16*, cudaStream_t);

}  // namespace loom::kernels::cuda
