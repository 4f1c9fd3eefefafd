// Cross-entropy fused with softmax, one row per token: the log-sum-exp in one
// pass over the logits, and the gradient written over the logits in a second,
// so the probabilities never take memory of their own.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/simd.h"

namespace loom::kernels::cpu {

void CrossEntropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                  bool backward, float grad_scale, float* row_loss) {
#pragma omp parallel
  {
  std::vector<float> exps;
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits + r * vocab;
    const int32_t target = targets[r];
    if (target < 0) {
      row_loss[r] = 0.0f;
      if (backward) std::fill(x, x + vocab, 0.0f);
      continue;
    }
    const float mx = MaxV(x, vocab);
    std::vector<float>& e = exps;
    e.resize(vocab);
    ExpShifted(x, mx, vocab, e.data());
    const float sum = SumV(e.data(), vocab);
    const float lse = mx + std::log(sum);
    row_loss[r] = lse - x[target];
    if (backward) {
      ExpShifted(x, lse, vocab, x);
      for (int64_t c = 0; c < vocab; ++c) x[c] *= grad_scale;
      x[target] -= grad_scale;
    }
  }
  }
}

}  // namespace loom::kernels::cpu
