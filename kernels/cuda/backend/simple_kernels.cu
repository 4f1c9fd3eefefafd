#include "kernels/cuda/backend/simple_kernels.h"

#include <cfloat>

namespace loom::kernels::cuda::simple {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b < 1 ? 1 : b) : 65535);  // grid-stride loops cover the rest
}

__global__ void FillKernel(float* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = value;
}

__global__ void AxpyKernel(int64_t n, float alpha, const float* x, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] += alpha * x[i];
}

__global__ void ScaleKernel(int64_t n, float alpha, float* x) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] *= alpha;
}

constexpr int kSumThreads = 1024;

__global__ void SumSquaresKernel(const float* x, int64_t n, double* result) {
  __shared__ double partial[kSumThreads];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kSumThreads) sum += double(x[i]) * double(x[i]);
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kSumThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = partial[0];
}

template <typename S, typename D>
__device__ D ConvertValue(S v);
template <>
__device__ __nv_bfloat16 ConvertValue<float, __nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ float ConvertValue<__nv_bfloat16, float>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename S, typename D>
__global__ void ConvertKernel(const S* src, int64_t src_stride, int64_t rows, int64_t cols, D* dst,
                              int64_t dst_stride) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * dst_stride + c] = ConvertValue<S, D>(src[r * src_stride + c]);
  }
}

__global__ void ScaleAddKernel(int64_t rows, int64_t cols, float alpha, const float* src,
                               int64_t src_stride, float beta, float* dst, int64_t dst_stride) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float x = alpha * src[r * src_stride + c];
    float* d = dst + r * dst_stride + c;
    *d = beta == 0.0f ? x : x + beta * *d;
  }
}

// One thread per (token, head): both partial rows rescaled by their share of
// the merged normalizer (ring attention's log-sum-exp merge).
__global__ void AttentionMergeKernel(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                                     int64_t out_row_stride, float* lse, const float* block_out,
                                     int64_t block_row_stride, const float* block_lse) {
  const int64_t n = seq * heads;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < n;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = t / heads, h = t % heads;
    const float b = block_lse[h * seq + i];
    if (b == -INFINITY) continue;
    float* o = out + i * out_row_stride + h * head_dim;
    const float* bo = block_out + i * block_row_stride + h * head_dim;
    const float a = lse[h * seq + i];
    if (a == -INFINITY) {
      for (int64_t e = 0; e < head_dim; ++e) o[e] = bo[e];
      lse[h * seq + i] = b;
      continue;
    }
    const float mx = fmaxf(a, b);
    const float merged = mx + logf(expf(a - mx) + expf(b - mx));
    const float wa = expf(a - merged), wb = expf(b - merged);
    for (int64_t e = 0; e < head_dim; ++e) o[e] = o[e] * wa + bo[e] * wb;
    lse[h * seq + i] = merged;
  }
}

__global__ void EmbeddingForwardKernel(const int32_t* ids, int64_t num_tokens, const float* table,
                                       int64_t vocab_offset, int64_t vocab, int64_t dim,
                                       float* out) {
  const int64_t n = num_tokens * dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / dim, d = i % dim;
    const int64_t row = int64_t{ids[t]} - vocab_offset;
    out[i] = (row >= 0 && row < vocab) ? table[row * dim + d] : 0.0f;
  }
}

// One thread per column: tokens are added in order, so the result matches
// the CPU backend bit for bit and never depends on scheduling.
__global__ void EmbeddingBackwardKernel(const int32_t* ids, int64_t num_tokens,
                                        const float* d_out, int64_t vocab_offset, int64_t vocab,
                                        int64_t dim, float* d_table) {
  const int64_t d = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (d >= dim) return;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t row = int64_t{ids[t]} - vocab_offset;
    if (row >= 0 && row < vocab) d_table[row * dim + d] += d_out[t * dim + d];
  }
}

// Block-wide reduction in a fixed order; every thread gets the result.
template <bool kMax>
__device__ float BlockReduce(float v, float* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float other = scratch[threadIdx.x + half];
      scratch[threadIdx.x] = kMax ? fmaxf(scratch[threadIdx.x], other) : scratch[threadIdx.x] + other;
    }
    __syncthreads();
  }
  const float result = scratch[0];
  __syncthreads();
  return result;
}

__global__ void ShardStatsKernel(const float* logits, const int32_t* targets, int64_t vocab_offset,
                                 int64_t vocab, float* row_lse, float* row_target_logit) {
  __shared__ float scratch[kThreads];
  const int64_t r = blockIdx.x;
  const float* row = logits + r * vocab;
  float local_max = -FLT_MAX;
  for (int64_t c = threadIdx.x; c < vocab; c += kThreads) local_max = fmaxf(local_max, row[c]);
  const float row_max = BlockReduce<true>(local_max, scratch);
  float local_sum = 0.0f;
  for (int64_t c = threadIdx.x; c < vocab; c += kThreads) local_sum += expf(row[c] - row_max);
  const float sum = BlockReduce<false>(local_sum, scratch);
  if (threadIdx.x == 0) {
    row_lse[r] = row_max + logf(sum);
    const int64_t col = int64_t{targets[r]} - vocab_offset;
    row_target_logit[r] = (targets[r] >= 0 && col >= 0 && col < vocab) ? row[col] : 0.0f;
  }
}

__global__ void ShardBackwardKernel(float* logits, const int32_t* targets, int64_t vocab_offset,
                                    int64_t vocab, const float* row_lse, float grad_scale) {
  const int64_t r = blockIdx.x;
  float* row = logits + r * vocab;
  const int32_t target = targets[r];
  const float lse = row_lse[r];
  const int64_t col = int64_t{target} - vocab_offset;
  for (int64_t c = threadIdx.x; c < vocab; c += kThreads) {
    if (target < 0) {
      row[c] = 0.0f;
    } else {
      const float p = expf(row[c] - lse);
      row[c] = grad_scale * (p - (c == col ? 1.0f : 0.0f));
    }
  }
}

}  // namespace

cudaError_t Fill(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n < 0 || (n > 0 && !x)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  FillKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, value);
  return cudaGetLastError();
}

cudaError_t Axpy(int64_t n, float alpha, const float* x, float* y, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (!x || !y))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  AxpyKernel<<<Blocks(n), kThreads, 0, stream>>>(n, alpha, x, y);
  return cudaGetLastError();
}

cudaError_t Scale(int64_t n, float alpha, float* x, cudaStream_t stream) {
  if (n < 0 || (n > 0 && !x)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(n, alpha, x);
  return cudaGetLastError();
}

cudaError_t SumSquares(const float* x, int64_t n, double* result, cudaStream_t stream) {
  if (n < 0 || !result || (n > 0 && !x)) return cudaErrorInvalidValue;
  SumSquaresKernel<<<1, kSumThreads, 0, stream>>>(x, n, result);
  return cudaGetLastError();
}

cudaError_t FloatToBf16(const float* src, int64_t src_stride, int64_t rows, int64_t cols,
                        __nv_bfloat16* dst, int64_t dst_stride, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || src_stride < cols || dst_stride < cols) return cudaErrorInvalidValue;
  if (rows * cols == 0) return cudaSuccess;
  ConvertKernel<float, __nv_bfloat16>
      <<<Blocks(rows * cols), kThreads, 0, stream>>>(src, src_stride, rows, cols, dst, dst_stride);
  return cudaGetLastError();
}

cudaError_t Bf16ToFloat(const __nv_bfloat16* src, int64_t src_stride, int64_t rows,
                        int64_t cols, float* dst, int64_t dst_stride, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || src_stride < cols || dst_stride < cols) return cudaErrorInvalidValue;
  if (rows * cols == 0) return cudaSuccess;
  ConvertKernel<__nv_bfloat16, float>
      <<<Blocks(rows * cols), kThreads, 0, stream>>>(src, src_stride, rows, cols, dst, dst_stride);
  return cudaGetLastError();
}

cudaError_t AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                           int64_t out_row_stride, float* lse, const float* block_out,
                           int64_t block_row_stride, const float* block_lse,
                           cudaStream_t stream) {
  if (seq < 0 || heads < 0 || head_dim < 0) return cudaErrorInvalidValue;
  if (seq * heads == 0) return cudaSuccess;
  AttentionMergeKernel<<<Blocks(seq * heads), kThreads, 0, stream>>>(
      seq, heads, head_dim, out, out_row_stride, lse, block_out, block_row_stride, block_lse);
  return cudaGetLastError();
}

cudaError_t ScaleAdd(int64_t rows, int64_t cols, float alpha, const float* src,
                     int64_t src_stride, float beta, float* dst, int64_t dst_stride,
                     cudaStream_t stream) {
  if (rows < 0 || cols < 0 || src_stride < cols || dst_stride < cols) return cudaErrorInvalidValue;
  if (rows * cols == 0) return cudaSuccess;
  ScaleAddKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(rows, cols, alpha, src, src_stride,
                                                               beta, dst, dst_stride);
  return cudaGetLastError();
}

cudaError_t EmbeddingForward(const int32_t* ids, int64_t num_tokens, const float* table,
                             int64_t vocab_offset, int64_t vocab, int64_t dim, float* out,
                             cudaStream_t stream) {
  if (num_tokens < 0 || vocab < 1 || dim < 1) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  EmbeddingForwardKernel<<<Blocks(num_tokens * dim), kThreads, 0, stream>>>(
      ids, num_tokens, table, vocab_offset, vocab, dim, out);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                              int64_t vocab_offset, int64_t vocab, int64_t dim, float* d_table,
                              cudaStream_t stream) {
  if (num_tokens < 0 || vocab < 1 || dim < 1) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const int blocks = static_cast<int>((dim + kThreads - 1) / kThreads);
  EmbeddingBackwardKernel<<<blocks, kThreads, 0, stream>>>(ids, num_tokens, d_out, vocab_offset,
                                                           vocab, dim, d_table);
  return cudaGetLastError();
}

cudaError_t CrossEntropyShardStats(const float* logits, const int32_t* targets, int64_t rows,
                                   int64_t vocab_offset, int64_t vocab, float* row_lse,
                                   float* row_target_logit, cudaStream_t stream) {
  if (rows < 0 || rows > 0x7fffffff || vocab < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  ShardStatsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, targets, vocab_offset, vocab, row_lse, row_target_logit);
  return cudaGetLastError();
}

cudaError_t CrossEntropyShardBackward(float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab_offset, int64_t vocab, const float* row_lse,
                                      float grad_scale, cudaStream_t stream) {
  if (rows < 0 || rows > 0x7fffffff || vocab < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  ShardBackwardKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, targets, vocab_offset, vocab, row_lse, grad_scale);
  return cudaGetLastError();
}

}  // namespace loom::kernels::cuda::simple
