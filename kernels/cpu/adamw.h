// AdamW on fp32 host arrays, the CPU backend's optimizer step and the one the
// engine calls directly on its master weights.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// One torch.optim.AdamW step (single-tensor path), elementwise over n:
//   param *= 1 - lr * weight_decay            (decoupled decay)
//   m = beta1 * m + (1 - beta1) * grad
//   v = beta2 * v + (1 - beta2) * grad^2
//   param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// step counts from 1. The float operations follow PyTorch's order so results
// agree to rounding; multithreaded over fixed chunks, deterministic.
void AdamWStep(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, int64_t step);

}  // namespace loom::kernels::cpu
