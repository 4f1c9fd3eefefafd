// The online-softmax update of FlashAttention, in the log2 domain the kernels
// use (scores pre-multiplied by softmax_scale * log2(e), then exp2), including
// the fully-masked-row cases where a naive update produces NaN.
#pragma once

#include "kernels/cuda/hd/hd.h"

namespace loom::kernels::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Reference point subtracted before exp2: the running max, or 0 while the row
// has seen only masked scores (max == -inf), so exp2(-inf - ref) is 0, not NaN.
LOOM_HD float SoftmaxReference(float running_max) {
  return running_max == -INFINITY ? 0.0f : running_max;
}

// Folds a block whose maximum (log2 domain) is block_max into a row whose
// running max is *running_max. Returns the factor that the row's running sum
// and output accumulator must be multiplied by.
LOOM_HD float OnlineSoftmaxRescale(float* running_max, float block_max) {
  float old_max = *running_max;
  float new_max = old_max > block_max ? old_max : block_max;
  *running_max = new_max;
  return Exp2(old_max - SoftmaxReference(new_max));
}

// Natural-log log-sum-exp of the scaled scores, from the log2-domain max and
// the (unnormalized, relative to that max) sum. An empty row (every key masked)
// gets +inf, so that a backward pass recomputing exp(s - lse) yields 0.
LOOM_HD float SoftmaxLse(float running_max, float running_sum) {
  if (!(running_sum > 0.0f)) return INFINITY;
#if defined(__CUDA_ARCH__)
  return (SoftmaxReference(running_max) + log2f(running_sum)) * kLn2;
#else
  return (SoftmaxReference(running_max) + std::log2(running_sum)) * kLn2;
#endif
}

// 1 / sum for normalizing the output; 0 for an empty row (output is zeros).
LOOM_HD float SoftmaxInvSum(float running_sum) {
  return running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
}

}  // namespace loom::kernels::cuda
