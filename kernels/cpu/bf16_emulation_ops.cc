#include "kernels/cpu/bf16_emulation_ops.h"

#include <utility>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/hd/bf16_bits.h"

namespace loom::kernels::cpu {
namespace {

std::vector<float> Rounded(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  RoundToBf16Dense(x, rows, cols, ld, out.data());
  return out;
}

// Rounds a rows x cols matrix between leading dimensions (the kernel's
// widening of its bf16 outputs into the caller's strided fp32 tensors).
void RoundInto(const float* src, int64_t rows, int64_t cols, int64_t src_ld, float* dst,
               int64_t dst_ld) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * dst_ld + c] = cuda::RoundToBf16(src[r * src_ld + c]);
}

// The attention tensors packed densely (token stride = heads * head_dim), as
// CudaOps' attention packs them before its bf16 kernels.
struct Shapes {
  int64_t q_rows, q_cols, kv_rows, kv_cols;
};
Shapes ShapesOf(const AttentionDims& d) {
  return {d.batch * d.seq_q, d.num_heads * d.head_dim, d.batch * d.seq_kv,
          d.num_kv_heads * d.head_dim};
}
AttentionDims PackedDims(const AttentionDims& dims) {
  AttentionDims packed = dims;
  packed.q_row_stride = packed.o_row_stride = dims.num_heads * dims.head_dim;
  packed.k_row_stride = packed.v_row_stride = dims.num_kv_heads * dims.head_dim;
  return packed;
}

}  // namespace

void RoundToBf16Dense(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out) {
  RoundInto(x, rows, cols, ld, out, cols);
}

Bf16EmulationOps::Bf16EmulationOps(std::unique_ptr<Ops> inner)
    : ForwardingOps(std::move(inner)) {}

GemmScope Bf16EmulationOps::SetGemmScope(GemmScope scope) {
  return std::exchange(scope_, scope);
}

void Bf16EmulationOps::Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n,
                            int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                            int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0 || k <= 0) {
    inner().Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool a_t = trans_a == Transpose::kYes, b_t = trans_b == Transpose::kYes;
  // The stored matrices (what the GPU's cast kernel converts), densely.
  const int64_t a_rows = a_t ? k : m, a_cols = a_t ? m : k;
  const int64_t b_rows = b_t ? n : k, b_cols = b_t ? k : n;
  const std::vector<float> ra = Rounded(a, a_rows, a_cols, lda);
  const std::vector<float> rb = Rounded(b, b_rows, b_cols, ldb);
  inner().Gemm(trans_a, trans_b, m, n, k, alpha, ra.data(), a_cols, rb.data(), b_cols, beta, c,
               ldc);
  ++rounded_gemms_;
}

void Bf16EmulationOps::AttentionForward(const AttentionDims& dims, const float* q,
                                        const float* k, const float* v, float* out,
                                        float* lse) {
  const Shapes s = ShapesOf(dims);
  const std::vector<float> rq = Rounded(q, s.q_rows, s.q_cols, dims.q_row_stride);
  const std::vector<float> rk = Rounded(k, s.kv_rows, s.kv_cols, dims.k_row_stride);
  const std::vector<float> rv = Rounded(v, s.kv_rows, s.kv_cols, dims.v_row_stride);
  std::vector<float> packed_out(static_cast<size_t>(s.q_rows * s.q_cols));
  inner().AttentionForward(PackedDims(dims), rq.data(), rk.data(), rv.data(), packed_out.data(),
                           lse);
  // The GPU kernel writes bf16 and widens it into the caller's tensor.
  RoundInto(packed_out.data(), s.q_rows, s.q_cols, s.q_cols, out, dims.o_row_stride);
  ++rounded_attention_calls_;
}

void Bf16EmulationOps::AttentionBackward(const AttentionDims& dims, const float* q,
                                         const float* k, const float* v, const float* out,
                                         const float* lse, const float* d_out, float* dq,
                                         float* dk, float* dv) {
  const Shapes s = ShapesOf(dims);
  const std::vector<float> rq = Rounded(q, s.q_rows, s.q_cols, dims.q_row_stride);
  const std::vector<float> rk = Rounded(k, s.kv_rows, s.kv_cols, dims.k_row_stride);
  const std::vector<float> rv = Rounded(v, s.kv_rows, s.kv_cols, dims.v_row_stride);
  const std::vector<float> ro = Rounded(out, s.q_rows, s.q_cols, dims.o_row_stride);
  const std::vector<float> rdo = Rounded(d_out, s.q_rows, s.q_cols, dims.o_row_stride);
  std::vector<float> pdq(static_cast<size_t>(s.q_rows * s.q_cols));
  std::vector<float> pdk(static_cast<size_t>(s.kv_rows * s.kv_cols));
  std::vector<float> pdv(static_cast<size_t>(s.kv_rows * s.kv_cols));
  inner().AttentionBackward(PackedDims(dims), rq.data(), rk.data(), rv.data(), ro.data(), lse,
                            rdo.data(), pdq.data(), pdk.data(), pdv.data());
  RoundInto(pdq.data(), s.q_rows, s.q_cols, s.q_cols, dq, dims.q_row_stride);
  RoundInto(pdk.data(), s.kv_rows, s.kv_cols, s.kv_cols, dk, dims.k_row_stride);
  RoundInto(pdv.data(), s.kv_rows, s.kv_cols, s.kv_cols, dv, dims.v_row_stride);
  ++rounded_attention_calls_;
}

std::unique_ptr<Ops> MakeBf16EmulationOps(int num_threads) {
  return std::make_unique<Bf16EmulationOps>(MakeCpuOps(num_threads));
}

}  // namespace loom::kernels::cpu
