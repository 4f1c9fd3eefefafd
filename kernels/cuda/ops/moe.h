// CUDA kernels of the mixture-of-experts ops (kernels/ops.h: MoeRoute,
// MoePermute, MoeUnpermute, MoeGateGrad, MoeRouterBackward), so that a GPU
// MoE step routes, permutes and combines on the device; the host reads back
// only the per-expert counts and the aux loss's column sums (2E int64 + E
// doubles per layer). The reference each is held to sits beside it:
// kernels/reference/moe.h (tests/gpu/moe_ops_gpu_test.cu).
//
// Numerics: MoePermute (one rounded product) and MoeUnpermute (one fma per
// element and choice, in the reference's order) match it bit for bit; MoeRoute's integer outputs, counts and prob_sum (one
// thread per expert, tokens in order) too, its scores and weights to double
// exp's last bit; MoeGateGrad and MoeRouterBackward reduce in another order
// (tolerance). Limits: E <= 1024, top_k <= E (cudaErrorInvalidValue
// otherwise). Launchers enqueue on `stream` and return the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops.h"

namespace loom::kernels::cuda {

constexpr int64_t kMoeMaxExperts = 1024;

cudaError_t MoeRoute(const MoeRouteDims& d, const float* logits, const float* bias,
                     int32_t* expert, float* weight, float* scores, float* probs, int32_t* row_of,
                     int32_t* assignment_of, int64_t* counts, double* prob_sum,
                     cudaStream_t stream);
cudaError_t MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                       const int32_t* assignment_of, const float* weight, float* out,
                       cudaStream_t stream);
cudaError_t MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                         const int32_t* row_of, const float* weight, float* out,
                         cudaStream_t stream);
cudaError_t MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy,
                        const float* rows, const int32_t* row_of, float* d_weight,
                        cudaStream_t stream);
cudaError_t MoeRouterBackward(const MoeRouteDims& d, const int32_t* expert, const float* weight,
                              const float* scores, const float* probs, const int64_t* counts,
                              const float* d_weight, double aux_scale, float* d_logits,
                              cudaStream_t stream);

}  // namespace loom::kernels::cuda
