// FP8 (e4m3) training GEMMs in the DeepSeek-V3 manner: quantizers that produce
// codes plus fp32 scales (activations in 1 x 128 tiles, weights in 128 x 128
// blocks, transposing variants for the gradient GEMMs) and a block-scaled GEMM
// that promotes its partial sums to fp32 with their scales every 128 of K.
// Layouts are defined once, in kernels/cuda/reference/fp8_reference.h.
//
// The three training GEMMs, all "NT" (both operands K-major):
//   forward  Y[T, N]  = X[T, K] W[N, K]^T : A = act(X),        B = weight(W)
//   dgrad    dX[T, K] = dY[T, N] W[N, K]  : A = act(dY),       B = weight(W, transpose)
//   wgrad    dW[N, K] = dY^T X            : A = act(dY, transpose), B = act(X, transpose)
//                                           with Fp8BScales::kTile1x128
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

// Activations: x [rows, cols] -> codes [rows, cols] and scales
// [ceil(cols/128), rows]; with transpose, codes [cols, rows] and scales
// [ceil(rows/128), cols]. Any rows/cols >= 1. The fp32 overload serves the
// fp32 ops API (CudaOps' fp8 recipe), whose activations are never bf16.
cudaError_t QuantizeActivationFp8(const __nv_bfloat16* x, int rows, int cols, bool transpose,
                                  uint8_t* codes, float* scales, cudaStream_t stream);
cudaError_t QuantizeActivationFp8(const float* x, int rows, int cols, bool transpose,
                                  uint8_t* codes, float* scales, cudaStream_t stream);

// Weights (fp32 master or bf16): w [n, k] -> codes [n, k], scales
// [ceil(n/128), ceil(k/128)]; with transpose codes [k, n], scales
// [ceil(k/128), ceil(n/128)].
cudaError_t QuantizeWeightFp8(const float* w, int n, int k, bool transpose, uint8_t* codes,
                              float* scales, cudaStream_t stream);
cudaError_t QuantizeWeightFp8(const __nv_bfloat16* w, int n, int k, bool transpose,
                              uint8_t* codes, float* scales, cudaStream_t stream);

enum class Fp8BScales { kBlock128x128, kTile1x128 };

// kMmaSync: codes converted exactly to fp16 in shared memory, mma.sync;
// kWgmma: fp8 wgmma on sm_90a (Hopper's fp8 tensor-core path).
enum class Fp8GemmImpl { kDefault, kMmaSync, kWgmma };

// D[m, n] (bf16, row-major) = sum over k blocks of a_scale * b_scale * (A B^T
// over the block). a: codes [m, k], a_scales [k/128, m]; b: codes [n, k],
// scales per b_layout. m, n, k multiples of 128; 16-byte aligned pointers.
cudaError_t Fp8BlockScaledGemm(const uint8_t* a, const float* a_scales, const uint8_t* b,
                               const float* b_scales, Fp8BScales b_layout, int m, int n, int k,
                               __nv_bfloat16* d, cudaStream_t stream,
                               Fp8GemmImpl impl = Fp8GemmImpl::kDefault);
// The same GEMM with an fp32 D (the promoted fp32 totals, not rounded to
// bf16): for results that feed fp32 tensors, as in CudaOps' fp8 recipe.
cudaError_t Fp8BlockScaledGemm(const uint8_t* a, const float* a_scales, const uint8_t* b,
                               const float* b_scales, Fp8BScales b_layout, int m, int n, int k,
                               float* d, cudaStream_t stream,
                               Fp8GemmImpl impl = Fp8GemmImpl::kDefault);

}  // namespace loom::kernels::cuda
