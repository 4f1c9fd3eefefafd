// Reference cross-entropy (softmax + negative log-likelihood, in double) and
// AdamW written from torch.optim.AdamW's documented update. std-only.
#pragma once

#include <cmath>
#include <cstdint>

namespace loom::kernels::reference {

// Rows with target < 0 get loss 0 and, when d_logits is given, gradient 0.
template <typename T>
inline void CrossEntropy(const T* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                         double grad_scale, T* row_loss, T* d_logits) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = logits + r * vocab;
    if (targets[r] < 0) {
      row_loss[r] = 0;
      if (d_logits)
        for (int64_t c = 0; c < vocab; ++c) d_logits[r * vocab + c] = 0;
      continue;
    }
    double mx = x[0];
    for (int64_t c = 1; c < vocab; ++c) mx = x[c] > mx ? x[c] : mx;
    double sum = 0;
    for (int64_t c = 0; c < vocab; ++c) sum += std::exp(x[c] - mx);
    const double lse = mx + std::log(sum);
    row_loss[r] = static_cast<T>(lse - x[targets[r]]);
    if (d_logits)
      for (int64_t c = 0; c < vocab; ++c)
        d_logits[r * vocab + c] = static_cast<T>(
            grad_scale * (std::exp(x[c] - lse) - (c == targets[r] ? 1.0 : 0.0)));
  }
}

// param *= 1 - lr*wd; m, v moments; param -= lr * m_hat / (sqrt(v_hat) + eps).
inline void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  for (int64_t i = 0; i < n; ++i) {
    double p = param[i] * (1.0 - static_cast<double>(lr) * weight_decay);
    m[i] = static_cast<float>(beta1 * static_cast<double>(m[i]) + (1.0 - beta1) * grad[i]);
    v[i] = static_cast<float>(beta2 * static_cast<double>(v[i]) +
                              (1.0 - beta2) * static_cast<double>(grad[i]) * grad[i]);
    const double denom = std::sqrt(v[i] / bc2) + eps;
    p -= lr * (m[i] / bc1) / denom;
    param[i] = static_cast<float>(p);
  }
}

}  // namespace loom::kernels::reference
