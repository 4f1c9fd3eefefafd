// SwiGLU forward and backward, 8 elements per thread with 16-byte accesses.
// silu(g) = g * sigmoid(g); d/dg silu = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
#include "kernels/cuda/ops/fused_ops.h"
#include "kernels/cuda/ops/vec.cuh"

namespace loom::kernels::cuda {
namespace {

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

template <typename T>
__global__ void SwiGluFwdKernel(int64_t rows, int dim, const T* __restrict__ gate, const T* __restrict__ up,
                                int64_t in_stride, T* __restrict__ out, int64_t out_stride) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int per_row = dim / 8;
  if (idx >= rows * per_row) return;
  const int64_t r = idx / per_row;
  const int c = static_cast<int>(idx % per_row) * 8;
  float g[8], u[8], o[8];
  Load8(gate + r * in_stride + c, g);
  Load8(up + r * in_stride + c, u);
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = g[e] * Sigmoid(g[e]) * u[e];
  Store8(out + r * out_stride + c, o);
}

template <typename T>
__global__ void SwiGluBwdKernel(int64_t rows, int dim, const T* gate, const T* up, int64_t in_stride,
                                const T* d_out, int64_t out_stride, T* d_gate, T* d_up) {  // may alias
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int per_row = dim / 8;
  if (idx >= rows * per_row) return;
  const int64_t r = idx / per_row;
  const int c = static_cast<int>(idx % per_row) * 8;
  float g[8], u[8], d[8], dg[8], du[8];
  Load8(gate + r * in_stride + c, g);
  Load8(up + r * in_stride + c, u);
  Load8(d_out + r * out_stride + c, d);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float s = Sigmoid(g[e]);
    du[e] = d[e] * g[e] * s;
    dg[e] = d[e] * u[e] * s * (1.0f + g[e] * (1.0f - s));
  }
  // gate/up may alias d_gate/d_up (in-place backward): all reads happen above.
  Store8(d_gate + r * in_stride + c, dg);
  Store8(d_up + r * in_stride + c, du);
}

bool SwiArgsOk(int64_t rows, int64_t dim, int64_t in_stride, int64_t out_stride,
               std::initializer_list<const void*> ptrs) {
  if (rows < 1 || dim < 8 || dim % 8 != 0 || in_stride % 8 != 0 || out_stride % 8 != 0 || in_stride < dim ||
      out_stride < dim)
    return false;
  for (const void* p : ptrs)
    if (!p || !IsAligned16(p)) return false;
  return true;
}

}  // namespace

template <typename T>
cudaError_t SwiGluForward(int64_t rows, int64_t dim, const T* gate, const T* up, int64_t in_stride, T* out,
                          int64_t out_stride, cudaStream_t stream) {
  if (!SwiArgsOk(rows, dim, in_stride, out_stride, {gate, up, out})) return cudaErrorInvalidValue;
  const int64_t threads = rows * (dim / 8);
  SwiGluFwdKernel<T><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      rows, static_cast<int>(dim), gate, up, in_stride, out, out_stride);
  return cudaGetLastError();
}

template <typename T>
cudaError_t SwiGluBackward(int64_t rows, int64_t dim, const T* gate, const T* up, int64_t in_stride, const T* d_out,
                           int64_t out_stride, T* d_gate, T* d_up, cudaStream_t stream) {
  if (!SwiArgsOk(rows, dim, in_stride, out_stride, {gate, up, d_out, d_gate, d_up})) return cudaErrorInvalidValue;
  const int64_t threads = rows * (dim / 8);
  SwiGluBwdKernel<T><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      rows, static_cast<int>(dim), gate, up, in_stride, d_out, out_stride, d_gate, d_up);
  return cudaGetLastError();
}

#define LOOM_SWIGLU_INSTANTIATE(T)                                                                         \
  template cudaError_t SwiGluForward<T>(int64_t, int64_t, const T*, const T*, int64_t, T*, int64_t,         \
                                        cudaStream_t);                                                      \
  template cudaError_t SwiGluBackward<T>(int64_t, int64_t, const T*, const T*, int64_t, const T*, int64_t, \
                                         T*, T*, cudaStream_t);
LOOM_SWIGLU_INSTANTIATE(float)
LOOM_SWIGLU_INSTANTIATE(__nv_bfloat16)
#undef LOOM_SWIGLU_INSTANTIATE

}  // namespace loom::kernels::cuda
