// The CPU backend's mixture-of-experts ops: the reference loops of
// kernels/reference/moe.h, split over tokens (or rows) across the OpenMP
// threads. Each output element is computed by one thread in the reference's
// order, so the results are the reference's bits for any thread count; only
// the stable counting sort of MoeRoute stays sequential (its cost is one pass
// over tokens * top_k integers).
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/reference/moe.h"

namespace loom::kernels::cpu {

namespace ref = loom::kernels::reference;

void MoeRoute(const MoeRouteDims& d, const float* logits, const float* bias, int32_t* expert,
              float* weight, float* scores, float* probs, int32_t* row_of, int32_t* assignment_of,
              int64_t* counts, double* prob_sum) {
#pragma omp parallel if (d.tokens * d.num_experts > (1 << 14))
  {
    std::vector<int32_t> order(static_cast<size_t>(d.num_experts));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d.tokens; ++t) {
      ref::MoeRouteToken(d, t, logits, bias, expert, weight, scores, probs, order.data());
    }
  }
  ref::MoeRouteRows(d, expert, row_of, assignment_of, counts);
  ref::MoeProbSums(d, probs, prob_sum);
}

void MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                const int32_t* assignment_of, const float* weight, float* out) {
#pragma omp parallel for schedule(static) if (rows * width > (1 << 16))
  for (int64_t row = 0; row < rows; ++row) {
    ref::MoePermute(1, top_k, width, x, assignment_of + row, weight, out + row * width);
  }
}

void MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                  const int32_t* row_of, const float* weight, float* out) {
#pragma omp parallel for schedule(static) if (tokens * top_k * width > (1 << 16))
  for (int64_t t = 0; t < tokens; ++t) {
    ref::MoeUnpermute(1, top_k, width, in, row_of + t * top_k,
                      weight != nullptr ? weight + t * top_k : nullptr, out + t * width);
  }
}

void MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy, const float* rows,
                 const int32_t* row_of, float* d_weight) {
#pragma omp parallel for schedule(static) if (tokens * top_k * width > (1 << 16))
  for (int64_t t = 0; t < tokens; ++t) {
    ref::MoeGateGrad(1, top_k, width, dy + t * width, rows, row_of + t * top_k,
                     d_weight + t * top_k);
  }
}

void MoeRouterBackward(const MoeRouteDims& d, const int32_t* expert, const float* weight,
                       const float* scores, const float* probs, const int64_t* counts,
                       const float* d_weight, double aux_scale, float* d_logits) {
  std::vector<double> g_aux(static_cast<size_t>(d.num_experts));
  for (int64_t e = 0; e < d.num_experts; ++e) g_aux[e] = ref::MoeAuxGrad(d, counts, aux_scale, e);
#pragma omp parallel if (d.tokens * d.num_experts > (1 << 14))
  {
    std::vector<double> ds(g_aux.size());
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d.tokens; ++t) {
      ref::MoeRouterBackwardToken(d, t, expert, weight, scores, probs, g_aux.data(), d_weight,
                                  ds.data(), d_logits);
    }
  }
}

}  // namespace loom::kernels::cpu
