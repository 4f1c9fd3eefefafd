// C entry points over the CUDA kernels for the device harness
// (scripts/device/bench_vs_torch.py calls them through ctypes on torch
// tensors, so our kernels and the PyTorch baselines are timed the same way on
// the same inputs). Contiguous layouts only: q/out [b, s, h, d], k/v
// [b, s, kvh, d]. Each returns a cudaError_t as int.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/fp8/fp8.h"

namespace {

loom::kernels::AttentionDims Dims(int b, int sq, int skv, int h, int kvh, int d, int causal, float scale) {
  loom::kernels::AttentionDims dims;
  dims.batch = b;
  dims.seq_q = sq;
  dims.seq_kv = skv;
  dims.num_heads = h;
  dims.num_kv_heads = kvh;
  dims.head_dim = d;
  dims.causal = causal != 0;
  dims.scale = scale;
  dims.q_row_stride = dims.o_row_stride = static_cast<int64_t>(h) * d;
  dims.k_row_stride = dims.v_row_stride = static_cast<int64_t>(kvh) * d;
  return dims;
}

using bf16 = __nv_bfloat16;

}  // namespace

extern "C" {

int loom_attention_forward(const void* q, const void* k, const void* v, void* out, float* lse, int b, int sq,
                           int skv, int h, int kvh, int d, int causal, float scale, int block_m, void* stream) {
  return loom::kernels::cuda::AttentionForward(Dims(b, sq, skv, h, kvh, d, causal, scale),
                                               static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                                               static_cast<const bf16*>(v), static_cast<bf16*>(out), lse,
                                               static_cast<cudaStream_t>(stream), block_m);
}

size_t loom_attention_backward_workspace(int b, int sq, int skv, int h, int kvh, int d) {
  return loom::kernels::cuda::AttentionBackwardWorkspaceBytes(Dims(b, sq, skv, h, kvh, d, 1, 1.f));
}

int loom_attention_backward(const void* q, const void* k, const void* v, const void* out, const float* lse,
                            const void* d_out, void* dq, void* dk, void* dv, void* workspace, int b, int sq, int skv,
                            int h, int kvh, int d, int causal, float scale, void* stream) {
  return loom::kernels::cuda::AttentionBackward(
      Dims(b, sq, skv, h, kvh, d, causal, scale), static_cast<const bf16*>(q), static_cast<const bf16*>(k),
      static_cast<const bf16*>(v), static_cast<const bf16*>(out), lse, static_cast<const bf16*>(d_out),
      static_cast<bf16*>(dq), static_cast<bf16*>(dk), static_cast<bf16*>(dv), workspace,
      static_cast<cudaStream_t>(stream));
}

int loom_quantize_activation(const void* x, int rows, int cols, int transpose, void* codes, float* scales,
                             void* stream) {
  return loom::kernels::cuda::QuantizeActivationFp8(static_cast<const bf16*>(x), rows, cols, transpose != 0,
                                                    static_cast<uint8_t*>(codes), scales,
                                                    static_cast<cudaStream_t>(stream));
}

int loom_quantize_weight_bf16(const void* w, int n, int k, int transpose, void* codes, float* scales, void* stream) {
  return loom::kernels::cuda::QuantizeWeightFp8(static_cast<const bf16*>(w), n, k, transpose != 0,
                                                static_cast<uint8_t*>(codes), scales,
                                                static_cast<cudaStream_t>(stream));
}

// impl: 0 default, 1 mma.sync, 2 wgmma. b_tile_scales: 0 128x128 blocks, 1 1x128 tiles.
int loom_fp8_gemm(const void* a, const float* a_scales, const void* b, const float* b_scales, int b_tile_scales, int m,
                  int n, int k, void* d, int impl, void* stream) {
  using loom::kernels::cuda::Fp8GemmImpl;
  const Fp8GemmImpl which = impl == 2 ? Fp8GemmImpl::kWgmma : impl == 1 ? Fp8GemmImpl::kMmaSync : Fp8GemmImpl::kDefault;
  return loom::kernels::cuda::Fp8BlockScaledGemm(
      static_cast<const uint8_t*>(a), a_scales, static_cast<const uint8_t*>(b), b_scales,
      b_tile_scales ? loom::kernels::cuda::Fp8BScales::kTile1x128 : loom::kernels::cuda::Fp8BScales::kBlock128x128, m,
      n, k, static_cast<bf16*>(d), static_cast<cudaStream_t>(stream), which);
}

}  // extern "C"
