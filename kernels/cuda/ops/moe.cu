// The mixture-of-experts kernels (moe.h); the loops they parallelize are
// kernels/reference/moe.h's, named in each kernel's comment.
#include "kernels/cuda/ops/moe.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

// Whether expert a precedes expert b in the selection order: larger
// score + bias first, ties to the lower id (MoeRouteToken's comparator).
__device__ __forceinline__ bool Before(double sa, int a, double sb, int b) {
  return sa != sb ? sa > sb : a < b;
}

// MoeRouteToken: one thread per token. The top_k choices are found one at a
// time as the best expert strictly after the previous choice in the order,
// which is the order partial_sort yields.
__global__ void RouteTokenKernel(MoeRouteDims d, const float* __restrict__ logits,
                                 const float* __restrict__ bias, int32_t* __restrict__ expert,
                                 float* __restrict__ weight, float* __restrict__ scores,
                                 float* __restrict__ probs) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= d.tokens) return;
  const int e_count = static_cast<int>(d.num_experts);
  const int k = static_cast<int>(d.top_k);
  const float* l = logits + t * e_count;
  float* s = scores + t * e_count;
  float* p = probs + t * e_count;
  double total = 0;
  if (d.score == MoeScore::kSoftmax) {
    double max = l[0];
    for (int e = 1; e < e_count; ++e) max = fmax(max, static_cast<double>(l[e]));
    for (int e = 0; e < e_count; ++e) total += exp(static_cast<double>(l[e]) - max);
    for (int e = 0; e < e_count; ++e) {
      const float v = static_cast<float>(exp(static_cast<double>(l[e]) - max) / total);
      s[e] = v;
      p[e] = v;
    }
  } else {
    for (int e = 0; e < e_count; ++e) {
      s[e] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(l[e]))));
      total += s[e];
    }
    for (int e = 0; e < e_count; ++e) p[e] = static_cast<float>(s[e] / total);
  }
  double prev_score = 0;
  int prev = -1;
  double chosen = 0;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    double best_score = 0;
    for (int e = 0; e < e_count; ++e) {
      const double se = static_cast<double>(s[e]) + (bias != nullptr ? static_cast<double>(bias[e]) : 0.0);
      if (prev >= 0 && !Before(prev_score, prev, se, e)) continue;  // chosen already
      if (best < 0 || Before(se, e, best_score, best)) {
        best = e;
        best_score = se;
      }
    }
    if (best < 0) best = 0;  // only NaN scores leave no candidate: stay in bounds
    expert[t * k + j] = best;
    chosen += s[best];
    prev = best;
    prev_score = best_score;
  }
  for (int j = 0; j < k; ++j) {
    weight[t * k + j] = static_cast<float>(s[expert[t * k + j]] / chosen);
  }
}

// MoeRouteRows, first half: one block per expert walks the assignments in
// order, a block-wide scan giving each of the expert's assignments its rank;
// ranks past the capacity are dropped (-1). counts[e] = kept, counts[E + e] =
// routed.
__global__ void RankKernel(MoeRouteDims d, const int32_t* __restrict__ expert,
                           int32_t* __restrict__ row_of, int64_t* __restrict__ counts) {
  __shared__ int flags[kThreads];
  const int e = blockIdx.x;
  const int64_t assignments = d.tokens * d.top_k;
  int64_t base = 0;
  for (int64_t start = 0; start < assignments; start += kThreads) {
    const int64_t a = start + threadIdx.x;
    const int mine = (a < assignments && expert[a] == e) ? 1 : 0;
    flags[threadIdx.x] = mine;
    __syncthreads();
    // Hillis-Steele inclusive scan over the chunk.
    for (int offset = 1; offset < kThreads; offset <<= 1) {
      const int add = threadIdx.x >= offset ? flags[threadIdx.x - offset] : 0;
      __syncthreads();
      flags[threadIdx.x] += add;
      __syncthreads();
    }
    if (mine) {
      const int64_t rank = base + flags[threadIdx.x] - 1;
      row_of[a] = (d.capacity > 0 && rank >= d.capacity) ? -1 : static_cast<int32_t>(rank);
    }
    base += flags[kThreads - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    counts[e] = d.capacity > 0 && base > d.capacity ? d.capacity : base;
    counts[d.num_experts + e] = base;
  }
}

// MoeRouteRows, second half: ranks become rows (each expert's first row is
// the kept counts of the experts before it) and the inverse is written.
__global__ void RowsKernel(MoeRouteDims d, const int32_t* __restrict__ expert,
                           const int64_t* __restrict__ counts, int32_t* __restrict__ row_of,
                           int32_t* __restrict__ assignment_of) {
  __shared__ int64_t first[kMoeMaxExperts];
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int64_t e = 0; e < d.num_experts; ++e) {
      first[e] = sum;
      sum += counts[e];
    }
  }
  __syncthreads();
  const int64_t assignments = d.tokens * d.top_k;
  for (int64_t a = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; a < assignments;
       a += int64_t{gridDim.x} * blockDim.x) {
    const int32_t rank = row_of[a];
    if (rank < 0) continue;
    const int32_t row = static_cast<int32_t>(first[expert[a]] + rank);
    row_of[a] = row;
    assignment_of[row] = static_cast<int32_t>(a);
  }
}

// MoeProbSums: one thread per expert, tokens in order (the reference's sum).
__global__ void ProbSumKernel(MoeRouteDims d, const float* __restrict__ probs,
                              double* __restrict__ prob_sum) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= d.num_experts) return;
  double sum = 0;
  for (int64_t t = 0; t < d.tokens; ++t) sum += probs[t * d.num_experts + e];
  prob_sum[e] = sum;
}

// MoePermute: one thread per output element.
__global__ void PermuteKernel(int64_t rows, int64_t top_k, int64_t width,
                              const float* __restrict__ x, const int32_t* __restrict__ assignment_of,
                              const float* __restrict__ weight, float* __restrict__ out) {
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / width, c = i % width;
    const int32_t a = assignment_of[row];
    const float v = x[(a / top_k) * width + c];
    out[i] = weight != nullptr ? __fmul_rn(v, weight[a]) : v;
  }
}

// MoeUnpermute: one thread per output element, the token's choices in order.
__global__ void UnpermuteKernel(int64_t tokens, int64_t top_k, int64_t width,
                                const float* __restrict__ in, const int32_t* __restrict__ row_of,
                                const float* __restrict__ weight, float* __restrict__ out) {
  const int64_t n = tokens * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / width, c = i % width;
    float acc = out[i];
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t a = t * top_k + j;
      const int32_t row = row_of[a];
      if (row < 0) continue;
      const float w = weight != nullptr ? weight[a] : 1.0f;
      acc = __fmaf_rn(w, in[static_cast<int64_t>(row) * width + c], acc);
    }
    out[i] = acc;
  }
}

// MoeGateGrad: one warp per assignment, the dot product in double.
__global__ void GateGradKernel(int64_t tokens, int64_t top_k, int64_t width,
                               const float* __restrict__ dy, const float* __restrict__ rows,
                               const int32_t* __restrict__ row_of, float* __restrict__ d_weight) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t a = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; a < tokens * top_k;
       a += warps) {
    const int32_t row = row_of[a];
    double dot = 0;
    if (row >= 0) {
      const float* x = dy + (a / top_k) * width;
      const float* y = rows + static_cast<int64_t>(row) * width;
      for (int64_t c = lane; c < width; c += 32) dot += static_cast<double>(x[c]) * y[c];
    }
    for (int offset = 16; offset > 0; offset >>= 1) dot += __shfl_down_sync(0xffffffffu, dot, offset);
    if (lane == 0) d_weight[a] = row >= 0 ? static_cast<float>(dot) : 0.0f;
  }
}

// MoeAuxGrad.
__device__ double AuxGrad(const MoeRouteDims& d, const int64_t* counts, double aux_scale, int e) {
  if (d.aux_loss_coef <= 0) return 0.0;
  return aux_scale * d.aux_loss_coef * static_cast<double>(d.num_experts) *
         static_cast<double>(counts[d.num_experts + e]) / static_cast<double>(d.tokens * d.top_k) /
         static_cast<double>(d.tokens);
}

// MoeRouterBackwardToken: one thread per token; ds[e] is recomputed from the
// token's top_k choices instead of kept in an array.
__global__ void RouterBackwardKernel(MoeRouteDims d, const int32_t* __restrict__ expert,
                                     const float* __restrict__ weight,
                                     const float* __restrict__ scores,
                                     const float* __restrict__ probs,
                                     const int64_t* __restrict__ counts,
                                     const float* __restrict__ d_weight, double aux_scale,
                                     float* __restrict__ d_logits) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= d.tokens) return;
  const int e_count = static_cast<int>(d.num_experts);
  const int64_t k = d.top_k;
  const float* s = scores + t * e_count;
  const float* p = probs + t * e_count;
  double chosen = 0, dot = 0;
  for (int64_t j = 0; j < k; ++j) {
    chosen += s[expert[t * k + j]];
    dot += static_cast<double>(d_weight[t * k + j]) * weight[t * k + j];
  }
  auto ds = [&](int e) {
    double v = 0;
    for (int64_t j = 0; j < k; ++j) {
      if (expert[t * k + j] == e) v += (d_weight[t * k + j] - dot) / chosen;
    }
    return v;
  };
  float* out = d_logits + t * e_count;
  if (d.score == MoeScore::kSoftmax) {
    double sd = 0;
    for (int e = 0; e < e_count; ++e) sd += (ds(e) + AuxGrad(d, counts, aux_scale, e)) * s[e];
    for (int e = 0; e < e_count; ++e) {
      out[e] = static_cast<float>(s[e] * (ds(e) + AuxGrad(d, counts, aux_scale, e) - sd));
    }
  } else {
    double total = 0, gp = 0;
    for (int e = 0; e < e_count; ++e) {
      total += s[e];
      gp += AuxGrad(d, counts, aux_scale, e) * p[e];
    }
    for (int e = 0; e < e_count; ++e) {
      const double g = ds(e) + (AuxGrad(d, counts, aux_scale, e) - gp) / total;
      out[e] = static_cast<float>(g * s[e] * (1.0 - s[e]));
    }
  }
}

bool RouteDimsOk(const MoeRouteDims& d) {
  return d.tokens >= 0 && d.num_experts >= 1 && d.num_experts <= kMoeMaxExperts && d.top_k >= 1 &&
         d.top_k <= d.num_experts && d.capacity >= 0 && d.tokens * d.top_k < (int64_t{1} << 31);
}

}  // namespace

cudaError_t MoeRoute(const MoeRouteDims& d, const float* logits, const float* bias,
                     int32_t* expert, float* weight, float* scores, float* probs, int32_t* row_of,
                     int32_t* assignment_of, int64_t* counts, double* prob_sum,
                     cudaStream_t stream) {
  if (!RouteDimsOk(d)) return cudaErrorInvalidValue;
  if (d.tokens > 0) {
    RouteTokenKernel<<<Blocks(d.tokens), kThreads, 0, stream>>>(d, logits, bias, expert, weight,
                                                                 scores, probs);
  }
  RankKernel<<<static_cast<unsigned>(d.num_experts), kThreads, 0, stream>>>(d, expert, row_of,
                                                                            counts);
  if (d.tokens > 0) {
    RowsKernel<<<Blocks(d.tokens * d.top_k), kThreads, 0, stream>>>(d, expert, counts, row_of,
                                                                     assignment_of);
  }
  ProbSumKernel<<<Blocks(d.num_experts), kThreads, 0, stream>>>(d, probs, prob_sum);
  return cudaGetLastError();
}

cudaError_t MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                       const int32_t* assignment_of, const float* weight, float* out,
                       cudaStream_t stream) {
  if (rows < 0 || top_k < 1 || width < 0) return cudaErrorInvalidValue;
  if (rows * width == 0) return cudaSuccess;
  PermuteKernel<<<Blocks(rows * width), kThreads, 0, stream>>>(rows, top_k, width, x,
                                                                assignment_of, weight, out);
  return cudaGetLastError();
}

cudaError_t MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                         const int32_t* row_of, const float* weight, float* out,
                         cudaStream_t stream) {
  if (tokens < 0 || top_k < 1 || width < 0) return cudaErrorInvalidValue;
  if (tokens * width == 0) return cudaSuccess;
  UnpermuteKernel<<<Blocks(tokens * width), kThreads, 0, stream>>>(tokens, top_k, width, in,
                                                                    row_of, weight, out);
  return cudaGetLastError();
}

cudaError_t MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy,
                        const float* rows, const int32_t* row_of, float* d_weight,
                        cudaStream_t stream) {
  if (tokens < 0 || top_k < 1 || width < 0) return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  GateGradKernel<<<Blocks(tokens * top_k * 32), kThreads, 0, stream>>>(tokens, top_k, width, dy,
                                                                        rows, row_of, d_weight);
  return cudaGetLastError();
}

cudaError_t MoeRouterBackward(const MoeRouteDims& d, const int32_t* expert, const float* weight,
                              const float* scores, const float* probs, const int64_t* counts,
                              const float* d_weight, double aux_scale, float* d_logits,
                              cudaStream_t stream) {
  if (!RouteDimsOk(d)) return cudaErrorInvalidValue;
  if (d.tokens == 0) return cudaSuccess;
  RouterBackwardKernel<<<Blocks(d.tokens), kThreads, 0, stream>>>(
      d, expert, weight, scores, probs, counts, d_weight, aux_scale, d_logits);
  return cudaGetLastError();
}

}  // namespace loom::kernels::cuda
