// Fused elementwise and row-wise CUDA kernels of the training step: RMSNorm
// forward/backward, RoPE (Hugging Face rotate-half), SwiGLU, cross-entropy
// fused with softmax, and AdamW over many tensors per launch. Semantics,
// layouts and argument order follow kernels/ops.h (the CPU backend's API), so
// a CUDA backend of Ops can forward to these. Activations T are float or
// __nv_bfloat16 (math in fp32); weights, statistics and optimizer state fp32.
//
// Launchers enqueue on `stream` and return the launch status (invalid
// arguments: cudaErrorInvalidValue). Row widths must be multiples of 8 and
// pointers 16-byte aligned (vectorized 16-byte accesses).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom::kernels::cuda {

// ---- RMSNorm (dim <= 16384) ----------------------------------------------------
template <typename T>
cudaError_t RmsNormForward(const T* x, const float* weight, int64_t rows, int64_t dim, float eps,
                           T* y, float* rstd, cudaStream_t stream);
// dx = (or += when accumulate_dx) the input gradient; ACCUMULATES d_weight.
// Deterministic: per-CTA partial weight gradients in `workspace`
// (RmsNormBackwardWorkspaceBytes), reduced in a fixed order.
size_t RmsNormBackwardWorkspaceBytes(int64_t dim);
template <typename T>
cudaError_t RmsNormBackward(const T* d_y, const T* x, const float* weight, const float* rstd,
                            int64_t rows, int64_t dim, T* dx, bool accumulate_dx,
                            float* d_weight, void* workspace, cudaStream_t stream);

// ---- RoPE, in place; cos/sin [max_positions, head_dim / 2] (rope_tables.h) -----
template <typename T>
cudaError_t RopeForward(T* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                        int64_t row_stride, const float* cos, const float* sin,
                        int64_t position_offset, cudaStream_t stream);
template <typename T>
cudaError_t RopeBackward(T* dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                         int64_t row_stride, const float* cos, const float* sin,
                         int64_t position_offset, cudaStream_t stream);

// ---- SwiGLU: out = silu(gate) * up --------------------------------------------
template <typename T>
cudaError_t SwiGluForward(int64_t rows, int64_t dim, const T* gate, const T* up, int64_t in_stride,
                          T* out, int64_t out_stride, cudaStream_t stream);
template <typename T>
cudaError_t SwiGluBackward(int64_t rows, int64_t dim, const T* gate, const T* up,
                           int64_t in_stride, const T* d_out, int64_t out_stride, T* d_gate,
                           T* d_up, cudaStream_t stream);

// ---- Cross-entropy with softmax ------------------------------------------------
// row_loss[r] = logsumexp(logits[r]) - logits[r, target[r]]; target < 0: loss 0.
// When d_logits is non-null it receives grad_scale * (softmax - onehot) (0 for
// ignored rows); it may alias logits (in place).
template <typename T>
cudaError_t CrossEntropy(const T* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                         float grad_scale, float* row_loss, T* d_logits, cudaStream_t stream);

// ---- AdamW over many tensors (torch.optim.AdamW, step counts from 1) ----------
struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  __nv_bfloat16* param_bf16 = nullptr;  // optional low-precision copy to refresh
  int64_t n = 0;
};
struct AdamWHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;
  float grad_scale = 1.f;  // multiplies every gradient first (clipping, loss-scale undo)
};
cudaError_t MultiTensorAdamW(const std::vector<AdamWTensor>& tensors, const AdamWHyper& hyper,
                             cudaStream_t stream);

}  // namespace loom::kernels::cuda
