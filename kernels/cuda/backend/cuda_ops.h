// The CUDA backend of the ops API (kernels/ops.h): fp32 tensors in device
// memory from a caching allocator, GEMMs through cuBLASLt, the fused kernels
// of kernels/cuda/ops/ and the bf16 attention of kernels/cuda/attention/, all
// enqueued in order on one compute stream owned by the backend.
//
// Precision: tensors are fp32 (master weights, gradients, activations,
// optimizer states). What a GEMM reads is the recipe's (CudaOpsOptions::
// recipe, train.precision): kFp32 runs cuBLASLt with CUBLAS_COMPUTE_32F
// (allow_tf32: CUBLAS_COMPUTE_32F_FAST_TF32); kBf16 casts both inputs to bf16
// in scratch and runs cuBLASLt on bf16 inputs with fp32 accumulation and
// fp32 C; kFp8 runs the GEMMs of GemmScope::kLinear on the FP8 kernels of
// kernels/cuda/fp8 (cuda_gemm_fp8.cc) and the others as kBf16. Attention, in
// every recipe, converts q/k/v (and out, d_out) to bf16, runs the bf16
// kernels with fp32 accumulation and converts the results back, so attention
// is bf16-accurate, not fp32. The CPU emulations of the recipes
// (kernels/cpu/bf16_emulation_ops.h, fp8_emulation_ops.h) round the same
// values the same way.
//
// Errors: the ops return nothing, so a failed launch, an unsupported shape
// (the fused kernels need row widths that are multiples of 8, attention head
// dims 64 or 128) or a CUDA error is recorded as the backend's first error
// (`error()`), and with abort_on_error (the default) printed to stderr and
// the process aborted: a training step never continues on a silent no-op.
//
// std-only apart from the CUDA headers, like kernels/ops.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/hardware/device_peaks.h"
#include "kernels/cuda/backend/caching_allocator.h"
#include "kernels/ops.h"

namespace loom::kernels::cuda {

// train.precision on a GPU (docs/gpu.md): which GEMMs run in which inputs,
// named by the GEMM dtype of the one precision descriptor
// (spec::RecipeOf(precision).gemm), so no mapping stands between them.
// kFp32 (and kTf32, which allow_tf32 governs): every GEMM in fp32; kBf16:
// every GEMM takes bf16 inputs with fp32 accumulation and output; kFp8: GEMMs
// in GemmScope::kLinear take e4m3 inputs with DeepSeek-V3's 1x128 / 128x128
// scaling, the rest as kBf16.
using CudaRecipe = hardware::Dtype;

struct CudaOpsOptions {
  int device = 0;
  CudaRecipe recipe = CudaRecipe::kFp32;
  bool allow_tf32 = false;     // GEMMs in TF32 (10-bit mantissa inputs) instead of fp32
  bool abort_on_error = true;  // false: record the error and keep going (tests)
  int64_t gemm_workspace_bytes = int64_t{32} << 20;
};

// GEMMs issued so far, by the precision of their inputs (for tests and logs:
// which path ran). fp8_fallback counts linear-scope GEMMs that kFp8 ran in
// bf16 because a padded dimension exceeds the FP8 kernels' limits.
struct CudaGemmCounts {
  int64_t fp32 = 0;
  int64_t bf16 = 0;
  int64_t fp8 = 0;
  int64_t fp8_fallback = 0;
};

class CudaOps final : public Ops {
 public:
  // Fails (nullptr, reason in *error) when there is no such CUDA device or
  // cuBLASLt cannot start.
  static std::unique_ptr<CudaOps> Create(const CudaOpsOptions& options, std::string* error);
  ~CudaOps() override;

  DeviceType device() const override { return DeviceType::kCuda; }
  const char* name() const override { return "cuda"; }
  int num_threads() const override { return 1; }

  // ---- Backend-specific --------------------------------------------------------
  cudaStream_t stream() const { return stream_; }
  int device_index() const { return options_.device; }
  // Ordering with other streams (e.g. NCCL's): record after / wait before.
  void RecordEvent(cudaEvent_t event);
  void WaitEvent(cudaEvent_t event);
  AllocatorStats allocator_stats() const { return allocator_->stats(); }
  void EmptyCache();  // synchronizes, then returns cached blocks to the driver
  void ResetPeakMemory() { allocator_->ResetPeaks(); }
  std::optional<DeviceMemoryStats> device_memory() const override {
    const AllocatorStats s = allocator_->stats();
    return DeviceMemoryStats{s.allocated_bytes, s.peak_allocated_bytes, s.reserved_bytes};
  }
  void ResetPeakDeviceMemory() override { allocator_->ResetPeaks(); }
  CudaRecipe recipe() const { return options_.recipe; }
  GemmScope gemm_scope() const { return scope_; }
  CudaGemmCounts gemm_counts() const { return gemm_counts_; }
  // The first error recorded (empty when none).
  bool ok() const;
  std::string error() const;

  // ---- Ops ---------------------------------------------------------------------
  Buffer Allocate(int64_t bytes) override;
  void CopyHostToDevice(void* dst, const void* src, int64_t bytes) override;
  void CopyDeviceToHost(void* dst, const void* src, int64_t bytes) override;
  void CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) override;
  void Fill(float* x, int64_t n, float value) override;
  void Synchronize() override;

  void Axpy(int64_t n, float alpha, const float* x, float* y) override;
  void Scale(int64_t n, float alpha, float* x) override;
  double SumSquares(const float* x, int64_t n) override;

  void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) override;
  // Only kFp8 reads the scope; every recipe keeps it so guards restore it.
  GemmScope SetGemmScope(GemmScope scope) override;

  void EmbeddingForward(const int32_t* ids, int64_t num_tokens, const float* table, int64_t vocab,
                        int64_t dim, float* out) override;
  void EmbeddingBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                         int64_t vocab, int64_t dim, float* d_table) override;

  void RmsNormForward(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                      float* y, float* rstd) override;
  void RmsNormBackward(const float* d_y, const float* x, const float* weight, const float* rstd,
                       int64_t rows, int64_t dim, float* dx, bool accumulate_dx,
                       float* d_weight) override;

  void RopeForward(float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                   int64_t row_stride, const float* cos, const float* sin,
                   int64_t position_offset) override;
  void RopeBackward(float* dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                    int64_t row_stride, const float* cos, const float* sin,
                    int64_t position_offset) override;

  void SwiGluForward(int64_t rows, int64_t dim, const float* gate, const float* up,
                     int64_t in_stride, float* out, int64_t out_stride) override;
  void SwiGluBackward(int64_t rows, int64_t dim, const float* gate, const float* up,
                      int64_t in_stride, const float* d_out, int64_t out_stride, float* d_gate,
                      float* d_up) override;

  void AttentionForward(const AttentionDims& dims, const float* q, const float* k,
                        const float* v, float* out, float* lse) override;
  void AttentionBackward(const AttentionDims& dims, const float* q, const float* k,
                         const float* v, const float* out, const float* lse, const float* d_out,
                         float* dq, float* dk, float* dv) override;
  void AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                      int64_t out_row_stride, float* lse, const float* block_out,
                      int64_t block_row_stride, const float* block_lse) override;
  void CopyRows(int64_t rows, int64_t cols, const float* src, int64_t src_stride, float* dst,
                int64_t dst_stride) override;

  void CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                           int64_t vocab, float* row_loss) override;
  void CrossEntropyForwardBackward(float* logits, const int32_t* targets, int64_t rows,
                                   int64_t vocab, float grad_scale, float* row_loss) override;

  void EmbeddingShardForward(const int32_t* ids, int64_t num_tokens, const float* table,
                             int64_t vocab_offset, int64_t vocab, int64_t dim,
                             float* out) override;
  void EmbeddingShardBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                              int64_t vocab_offset, int64_t vocab, int64_t dim,
                              float* d_table) override;
  void CrossEntropyShardStats(const float* logits, const int32_t* targets, int64_t rows,
                              int64_t vocab_offset, int64_t vocab, float* row_lse,
                              float* row_target_logit) override;
  void CrossEntropyShardBackward(float* logits, const int32_t* targets, int64_t rows,
                                 int64_t vocab_offset, int64_t vocab, const float* row_lse,
                                 float grad_scale) override;

  void MoeRoute(const MoeRouteDims& d, const float* logits, const float* bias, int32_t* expert,
                float* weight, float* scores, float* probs, int32_t* row_of,
                int32_t* assignment_of, int64_t* counts, double* prob_sum) override;
  void MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                  const int32_t* assignment_of, const float* weight, float* out) override;
  void MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                    const int32_t* row_of, const float* weight, float* out) override;
  void MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy,
                   const float* rows, const int32_t* row_of, float* d_weight) override;
  void MoeRouterBackward(const MoeRouteDims& d, const int32_t* expert, const float* weight,
                         const float* scores, const float* probs, const int64_t* counts,
                         const float* d_weight, double aux_scale, float* d_logits) override;

  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int64_t step) override;

 protected:
  void Free(void* data) override;

 private:
  struct LtState;  // cuBLASLt handle and workspace (cublasLt.h stays out of this header)

  explicit CudaOps(const CudaOpsOptions& options);
  // Records `what` failed with `status` unless status is cudaSuccess; true when ok.
  bool Check(cudaError_t status, const char* what);
  void Fail(const std::string& message);
  // Scratch memory freed when the returned Buffer dies; enqueue-ordered reuse
  // is safe on the single stream (see caching_allocator.h).
  Buffer Scratch(int64_t bytes, const char* what);

  // The recipes' GEMMs (cuda_gemm.cc, cuda_gemm_fp8.cc); m, n, k >= 1.
  // LtGemm: cuBLASLt with A and B both fp32 or both bf16 (bf16_inputs),
  // fp32 C, alpha and beta as in Gemm.
  void LtGemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const void* a, int64_t lda, const void* b, int64_t ldb, bool bf16_inputs,
              float beta, float* c, int64_t ldc);
  void GemmBf16(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                float* c, int64_t ldc);
  // False, having done nothing, when a padded dimension exceeds the FP8
  // kernels' limits (the caller runs the GEMM in bf16 instead).
  bool GemmFp8(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

  CudaOpsOptions options_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<LtState> lt_;
  mutable std::mutex error_mu_;
  std::string first_error_;
  GemmScope scope_ = GemmScope::kDefault;
  CudaGemmCounts gemm_counts_;
};

}  // namespace loom::kernels::cuda
