// CudaOps::Gemm through cuBLASLt, in the recipe's input precision (fp32 or
// bf16; the FP8 GEMMs are in cuda_gemm_fp8.cc). The ops API's matrices are
// row-major and cuBLASLt's column-major, and a row-major X is the
// column-major X^T with the same leading dimension, so C = op(A) op(B) is
// computed as the column-major C^T = op(B)^T op(A)^T: cuBLAS's "A" is our B
// and its "B" our A, with the transposes carried over unchanged and m and n
// swapped.
#include <cuda_bf16.h>

#include <string>
#include <utility>

#include "kernels/cuda/backend/cuda_lt_state.h"
#include "kernels/cuda/backend/cuda_ops.h"
#include "kernels/cuda/backend/simple_kernels.h"

namespace loom::kernels::cuda {
namespace {

const char* LtStatusName(cublasStatus_t status) { return cublasLtGetStatusName(status); }

// Destroys the descriptors of one call whichever way it ends.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Leading dimension of a bf16 copy: rounded up to 8 elements (16 bytes), the
// alignment cuBLASLt's fast bf16 kernels want.
int64_t Bf16Ld(int64_t cols) { return (cols + 7) / 8 * 8; }

}  // namespace

std::unique_ptr<CudaOps::LtState> CudaOps::LtState::Create(int64_t workspace_bytes,
                                                           std::string* error) {
  auto state = std::make_unique<LtState>();
  cublasStatus_t status = cublasLtCreate(&state->handle);
  if (status != CUBLAS_STATUS_SUCCESS) {
    *error = std::string("cublasLtCreate: ") + LtStatusName(status);
    return nullptr;
  }
  if (workspace_bytes > 0) {
    cudaError_t cuda_status = cudaMalloc(&state->workspace, static_cast<size_t>(workspace_bytes));
    if (cuda_status != cudaSuccess) {
      *error = std::string("cuBLASLt workspace: ") + cudaGetErrorString(cuda_status);
      return nullptr;
    }
    state->workspace_bytes = workspace_bytes;
  }
  return state;
}

CudaOps::LtState::~LtState() {
  if (workspace) cudaFree(workspace);
  if (handle) cublasLtDestroy(handle);
}

GemmScope CudaOps::SetGemmScope(GemmScope scope) { return std::exchange(scope_, scope); }

void CudaOps::Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                   float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    // Empty reduction: C = beta * C, which cuBLASLt does not promise to do.
    if (beta == 1.0f) return;
    for (int64_t row = 0; row < m; ++row) {
      if (beta == 0.0f) {
        Fill(c + row * ldc, n, 0.0f);
      } else {
        Scale(n, beta, c + row * ldc);
      }
    }
    return;
  }
  switch (options_.recipe) {
    case CudaRecipe::kTf32:
    case CudaRecipe::kFp32:
      ++gemm_counts_.fp32;
      LtGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, /*bf16_inputs=*/false, beta, c,
             ldc);
      return;
    case CudaRecipe::kFp8:
      if (scope_ == GemmScope::kLinear) {
        if (GemmFp8(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) {
          ++gemm_counts_.fp8;
          return;
        }
        ++gemm_counts_.fp8_fallback;
      }
      [[fallthrough]];
    case CudaRecipe::kBf16:
      ++gemm_counts_.bf16;
      GemmBf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
  }
}

void CudaOps::GemmBf16(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float beta, float* c, int64_t ldc) {
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  // The stored matrices, cast whole (round to nearest even, as
  // kernels/cuda/hd/bf16_bits.h and the CPU emulation round).
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  const int64_t a_ld = Bf16Ld(a_cols), b_ld = Bf16Ld(b_cols);
  const int64_t bf16_bytes = static_cast<int64_t>(sizeof(__nv_bfloat16));
  Buffer a16 = Scratch(a_rows * a_ld * bf16_bytes, "Gemm (bf16 copy of A)");
  Buffer b16 = Scratch(b_rows * b_ld * bf16_bytes, "Gemm (bf16 copy of B)");
  if (a16.empty() || b16.empty()) return;
  auto* a_bf16 = static_cast<__nv_bfloat16*>(a16.data());
  auto* b_bf16 = static_cast<__nv_bfloat16*>(b16.data());
  if (!Check(simple::FloatToBf16(a, lda, a_rows, a_cols, a_bf16, a_ld, stream_),
             "Gemm (bf16 cast of A)") ||
      !Check(simple::FloatToBf16(b, ldb, b_rows, b_cols, b_bf16, b_ld, stream_),
             "Gemm (bf16 cast of B)"))
    return;
  LtGemm(trans_a, trans_b, m, n, k, alpha, a_bf16, a_ld, b_bf16, b_ld, /*bf16_inputs=*/true, beta,
         c, ldc);
}

void CudaOps::LtGemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                     bool bf16_inputs, float beta, float* c, int64_t ldc) {
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  auto fail = [&](const char* step, cublasStatus_t status) {
    Fail(std::string("Gemm (m=") + std::to_string(m) + " n=" + std::to_string(n) +
         " k=" + std::to_string(k) + (bf16_inputs ? ", bf16 inputs" : "") + "): " + step + ": " +
         LtStatusName(status));
  };
  LtDescriptors d;
  // bf16 inputs always accumulate in fp32 (TF32 is an fp32-input mode).
  const cublasComputeType_t compute = options_.allow_tf32 && !bf16_inputs
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  const cudaDataType_t input_type = bf16_inputs ? CUDA_R_16BF : CUDA_R_32F;
  cublasStatus_t s = cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmulDescCreate", s);
  const cublasOperation_t op_lt_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS A = our B
  const cublasOperation_t op_lt_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS B = our A
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a));
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b));
  // Stored column-major shapes: our B is [k, n] row-major (or [n, k] when
  // transposed), i.e. column-major n x k (or k x n); likewise for A.
  s = cublasLtMatrixLayoutCreate(&d.a, input_type, tb ? k : n, tb ? n : k, ldb);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("layout of B", s);
  s = cublasLtMatrixLayoutCreate(&d.b, input_type, ta ? m : k, ta ? k : m, lda);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("layout of A", s);
  s = cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, n, m, ldc);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("layout of C", s);
  s = cublasLtMatmulPreferenceCreate(&d.pref);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmulPreferenceCreate", s);
  const size_t workspace_bytes = static_cast<size_t>(lt_->workspace_bytes);
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &workspace_bytes, sizeof(workspace_bytes));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  s = cublasLtMatmulAlgoGetHeuristic(lt_->handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic,
                                     &found);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0)
    return fail("no cuBLASLt algorithm (check leading dimensions)",
                s != CUBLAS_STATUS_SUCCESS ? s : CUBLAS_STATUS_NOT_SUPPORTED);
  s = cublasLtMatmul(lt_->handle, d.op, &alpha, b, d.a, a, d.b, &beta, c, d.c, c, d.c,
                     &heuristic.algo, lt_->workspace, workspace_bytes, stream_);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmul", s);
}

}  // namespace loom::kernels::cuda
