#include "kernels/cpu/adamw.h"

#include <cmath>

namespace loom::kernels::cpu {

void AdamWStep(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  // Scalars are formed in double then rounded, as PyTorch does with Python floats.
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  const float one_minus_b1 = static_cast<float>(1.0 - static_cast<double>(beta1));
  const float one_minus_b2 = static_cast<float>(1.0 - static_cast<double>(beta2));
  const float neg_step_size = static_cast<float>(-static_cast<double>(lr) / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float p = param[i] * decay;
    const float mi = m[i] * beta1 + one_minus_b1 * g;
    const float vi = v[i] * beta2 + one_minus_b2 * g * g;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    param[i] = p + neg_step_size * (mi / denom);
  }
}

}  // namespace loom::kernels::cpu
