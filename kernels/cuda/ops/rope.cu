// RoPE (Hugging Face rotate-half) in place: one thread per 8 consecutive
// rotation pairs (i, i + head_dim/2) of one token and head, reading the
// precomputed cos/sin tables. The backward pass is the inverse rotation
// (sin negated).
#include "kernels/cuda/ops/fused_ops.h"
#include "kernels/cuda/ops/vec.cuh"

namespace loom::kernels::cuda {
namespace {

template <typename T>
__global__ void RopeKernel(T* __restrict__ x, int64_t tokens, int64_t seq, int heads, int half, int64_t row_stride,
                           const float* __restrict__ cos_t, const float* __restrict__ sin_t, int64_t position_offset,
                           float sin_sign) {
  const int groups = half / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tokens * heads * groups) return;
  const int g = static_cast<int>(idx % groups);
  const int h = static_cast<int>((idx / groups) % heads);
  const int64_t token = idx / (static_cast<int64_t>(groups) * heads);
  const int64_t pos = position_offset + token % seq;
  T* v = x + token * row_stride + static_cast<int64_t>(h) * 2 * half + g * 8;
  float x1[8], x2[8], c[8], s[8], o1[8], o2[8];
  Load8(v, x1);
  Load8(v + half, x2);
  Load8(cos_t + pos * half + g * 8, c);
  Load8(sin_t + pos * half + g * 8, s);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float sn = sin_sign * s[e];
    o1[e] = x1[e] * c[e] - x2[e] * sn;
    o2[e] = x2[e] * c[e] + x1[e] * sn;
  }
  Store8(v, o1);
  Store8(v + half, o2);
}

template <typename T>
cudaError_t LaunchRope(T* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t row_stride,
                       const float* cos_t, const float* sin_t, int64_t position_offset, float sin_sign,
                       cudaStream_t stream) {
  if (!x || !cos_t || !sin_t || batch < 1 || seq < 1 || heads < 1 || head_dim % 16 != 0 || row_stride % 8 != 0 ||
      row_stride < heads * head_dim || !IsAligned16(x) || !IsAligned16(cos_t) || !IsAligned16(sin_t) ||
      position_offset < 0)
    return cudaErrorInvalidValue;
  const int half = static_cast<int>(head_dim / 2);
  const int64_t threads = batch * seq * heads * (half / 8);
  RopeKernel<T><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      x, batch * seq, seq, static_cast<int>(heads), half, row_stride, cos_t, sin_t, position_offset, sin_sign);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t RopeForward(T* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t row_stride,
                        const float* cos, const float* sin, int64_t position_offset, cudaStream_t stream) {
  return LaunchRope(x, batch, seq, heads, head_dim, row_stride, cos, sin, position_offset, 1.0f, stream);
}

template <typename T>
cudaError_t RopeBackward(T* dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t row_stride,
                         const float* cos, const float* sin, int64_t position_offset, cudaStream_t stream) {
  return LaunchRope(dx, batch, seq, heads, head_dim, row_stride, cos, sin, position_offset, -1.0f, stream);
}

#define LOOM_ROPE_INSTANTIATE(T)                                                                              \
  template cudaError_t RopeForward<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, const float*, const float*, \
                                      int64_t, cudaStream_t);                                                    \
  template cudaError_t RopeBackward<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, const float*,            \
                                       const float*, int64_t, cudaStream_t);
LOOM_ROPE_INSTANTIATE(float)
LOOM_ROPE_INSTANTIATE(__nv_bfloat16)
#undef LOOM_ROPE_INSTANTIATE

}  // namespace loom::kernels::cuda
