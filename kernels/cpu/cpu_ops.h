// The CPU backend of the ops API: fp32 on host memory, GEMMs through OpenBLAS
// and everything else through the OpenMP kernels of cpu_kernels.h.
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace loom::kernels::cpu {

class CpuOps final : public Ops {
 public:
  // num_threads <= 0: OpenMP's default. The thread count is process-wide
  // (OpenMP and OpenBLAS keep one pool each), so the last CpuOps built wins.
  explicit CpuOps(int num_threads = 0);

  DeviceType device() const override { return DeviceType::kCpu; }
  const char* name() const override { return "cpu"; }
  int num_threads() const override { return num_threads_; }

  Buffer Allocate(int64_t bytes) override;
  void CopyHostToDevice(void* dst, const void* src, int64_t bytes) override;
  void CopyDeviceToHost(void* dst, const void* src, int64_t bytes) override;
  void CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) override;
  void Fill(float* x, int64_t n, float value) override;
  void Synchronize() override {}

  void Axpy(int64_t n, float alpha, const float* x, float* y) override;
  void Scale(int64_t n, float alpha, float* x) override;
  double SumSquares(const float* x, int64_t n) override;

  void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) override;

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
  int num_threads_;
};

std::unique_ptr<Ops> MakeCpuOps(int num_threads = 0);

}  // namespace loom::kernels::cpu
