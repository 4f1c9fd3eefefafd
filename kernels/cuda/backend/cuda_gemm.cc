// CudaOps::Gemm through cuBLASLt. The ops API's matrices are row-major and
// cuBLASLt's column-major, and a row-major X is the column-major X^T with the
// same leading dimension, so C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T: cuBLAS's "A" is our B and its "B" our A, with the
// transposes carried over unchanged and m and n swapped.
#include <string>

#include "kernels/cuda/backend/cuda_lt_state.h"
#include "kernels/cuda/backend/cuda_ops.h"

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
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  auto fail = [&](const char* step, cublasStatus_t status) {
    Fail(std::string("Gemm (m=") + std::to_string(m) + " n=" + std::to_string(n) +
         " k=" + std::to_string(k) + "): " + step + ": " + LtStatusName(status));
  };
  LtDescriptors d;
  const cublasComputeType_t compute =
      options_.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasStatus_t s = cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmulDescCreate", s);
  const cublasOperation_t op_lt_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS A = our B
  const cublasOperation_t op_lt_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS B = our A
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a));
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b));
  // Stored column-major shapes: our B is [k, n] row-major (or [n, k] when
  // transposed), i.e. column-major n x k (or k x n); likewise for A.
  s = cublasLtMatrixLayoutCreate(&d.a, CUDA_R_32F, tb ? k : n, tb ? n : k, ldb);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("layout of B", s);
  s = cublasLtMatrixLayoutCreate(&d.b, CUDA_R_32F, ta ? m : k, ta ? k : m, lda);
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
