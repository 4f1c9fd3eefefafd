// GEMM through OpenBLAS, threaded by us rather than by OpenBLAS: the output is
// cut into one contiguous block of rows (or columns) per OpenMP thread and each
// thread calls single-threaded cblas_sgemm on its block. One thread pool
// (OpenMP) for every op means no second pool spinning against it on the same
// cores, and the fixed partition never splits K, so results do not vary run to
// run for a fixed thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"

namespace loom::kernels::cpu {
namespace {

// Below this many multiply-adds a single call beats the fork/join.
constexpr double kParallelMinFlops = 1 << 20;
constexpr int64_t kBlockAlign = 16;

void Sgemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta == Transpose::kYes ? CblasTrans : CblasNoTrans,
              tb == Transpose::kYes ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

}  // namespace

void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  if (m == 0 || n == 0) return;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads == 1 || static_cast<double>(m) * n * k < kParallelMinFlops) {
    Sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Split the larger of M and N into `threads` aligned blocks.
  const bool split_rows = m >= n;
  const int64_t extent = split_rows ? m : n;
  const int64_t block =
      ((extent + threads - 1) / threads + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
  const int64_t parts = (extent + block - 1) / block;
#pragma omp parallel for schedule(static, 1) num_threads(threads)
  for (int64_t part = 0; part < parts; ++part) {
    const int64_t begin = part * block, size = std::min(block, extent - begin);
    if (split_rows) {
      const float* a_part = trans_a == Transpose::kNo ? a + begin * lda : a + begin;
      Sgemm(trans_a, trans_b, size, n, k, alpha, a_part, lda, b, ldb, beta, c + begin * ldc, ldc);
    } else {
      const float* b_part = trans_b == Transpose::kNo ? b + begin : b + begin * ldb;
      Sgemm(trans_a, trans_b, m, size, k, alpha, a, lda, b_part, ldb, beta, c + begin, ldc);
    }
  }
}

}  // namespace loom::kernels::cpu
