// AdamW over many tensors per launch (the multi_tensor_apply pattern): the
// tensor list travels in the kernel's parameter space, each CTA takes one
// chunk of one tensor (found by binary search over the chunk prefix sums).
// Float operations in the CPU backend's order (kernels/cpu/adamw.cc), so both
// agree to rounding.
#include <cmath>

#include "kernels/cuda/ops/fused_ops.h"
#include "kernels/cuda/ops/vec.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kMaxTensors = 48;  // keeps the argument block under 4 KB
constexpr int kChunk = 16384;    // elements per CTA
constexpr int kThreads = 256;

struct AdamWArgs {
  AdamWTensor t[kMaxTensors];
  int block_start[kMaxTensors + 1];
  int num_tensors;
  float decay, beta1, beta2, one_minus_b1, one_minus_b2, neg_step_size, bc2_sqrt, eps, grad_scale;
};

__global__ void __launch_bounds__(kThreads) AdamWKernel(const __grid_constant__ AdamWArgs args) {
  int lo = 0, hi = args.num_tensors - 1;  // last tensor whose first block <= blockIdx.x
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (args.block_start[mid] <= static_cast<int>(blockIdx.x)) lo = mid; else hi = mid - 1;
  }
  const AdamWTensor& t = args.t[lo];
  const int64_t begin = static_cast<int64_t>(blockIdx.x - args.block_start[lo]) * kChunk;
  const int64_t end = begin + kChunk < t.n ? begin + kChunk : t.n;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float g = t.grad[i] * args.grad_scale;
    const float p = t.param[i] * args.decay;
    const float mi = t.m[i] * args.beta1 + args.one_minus_b1 * g;
    const float vi = t.v[i] * args.beta2 + args.one_minus_b2 * g * g;
    const float denom = __fsqrt_rn(vi) / args.bc2_sqrt + args.eps;
    t.m[i] = mi;
    t.v[i] = vi;
    const float np = p + args.neg_step_size * __fdiv_rn(mi, denom);
    t.param[i] = np;
    if (t.param_bf16 != nullptr) t.param_bf16[i] = __float2bfloat16_rn(np);
  }
}

}  // namespace

cudaError_t MultiTensorAdamW(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h, cudaStream_t stream) {
  if (h.step < 1) return cudaErrorInvalidValue;
  AdamWArgs args{};
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  args.decay = static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  args.beta1 = h.beta1;
  args.beta2 = h.beta2;
  args.one_minus_b1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  args.one_minus_b2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  args.neg_step_size = static_cast<float>(-static_cast<double>(h.lr) / bc1);
  args.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  args.eps = h.eps;
  args.grad_scale = h.grad_scale;
  auto flush = [&]() -> cudaError_t {
    if (args.num_tensors == 0) return cudaSuccess;
    const int blocks = args.block_start[args.num_tensors];
    AdamWKernel<<<blocks, kThreads, 0, stream>>>(args);
    args.num_tensors = 0;
    return cudaGetLastError();
  };
  for (const AdamWTensor& t : tensors) {
    if (t.n == 0) continue;
    if (t.n < 0 || !t.param || !t.grad || !t.m || !t.v) return cudaErrorInvalidValue;
    const int64_t chunks = (t.n + kChunk - 1) / kChunk;
    if (chunks > (1 << 30)) return cudaErrorInvalidValue;
    if (args.num_tensors == kMaxTensors ||
        static_cast<int64_t>(args.block_start[args.num_tensors]) + chunks > (1 << 30)) {
      cudaError_t err = flush();
      if (err != cudaSuccess) return err;
    }
    args.t[args.num_tensors] = t;
    args.block_start[args.num_tensors + 1] = args.block_start[args.num_tensors] + static_cast<int>(chunks);
    ++args.num_tensors;
  }
  return flush();
}

}  // namespace loom::kernels::cuda
