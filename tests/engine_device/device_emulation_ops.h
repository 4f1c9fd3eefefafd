// An Ops backend for tests that behaves like device memory on a machine
// without a device: it wraps a host backend (CpuOps) and hands out TAGGED
// pointers, the real host address plus 2^47. Such an address is not canonical
// on x86-64 (bits 47..63 differ), so any host load or store through it faults
// at once, exactly where code would crash on a GPU. Every op translates its
// tagged arguments back before forwarding, so the numbers are the inner
// backend's, bit for bit.
//
// Each op also checks its arguments: a pointer where the op needs backend
// memory must be a tagged pointer inside a live allocation, and the host side
// of CopyHostToDevice / CopyDeviceToHost must be an ordinary (untagged)
// address; a violation prints the op and the argument and aborts. So engine
// code that hands host memory to an op (which on a GPU would be an illegal
// address) fails the test too, not only code that reads device memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "kernels/ops.h"
#include "tests/engine_device/op_trace.h"

namespace loom::engine::testing {

class DeviceEmulationOps final : public kernels::Ops {
 public:
  static constexpr uintptr_t kTag = uintptr_t{1} << 47;

  explicit DeviceEmulationOps(std::unique_ptr<kernels::Ops> inner);
  ~DeviceEmulationOps() override;

  static bool IsDevicePointer(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & kTag) != 0;
  }

  // Calls per op since construction (tests assert the device path really ran).
  struct Counters {
    int64_t allocations = 0, live_allocations = 0, host_to_device_bytes = 0,
            device_to_host_bytes = 0, adamw = 0, sum_squares = 0, scale = 0, ops = 0;
  };
  Counters counters() const;

  // Records the attention ops (AttentionForward/Backward/Merge: what a ring
  // step computes) into `trace` from now on; nullptr stops. Not owned.
  void set_trace(OpTrace* trace) { trace_.store(trace); }

  // The host address behind `tagged` for code outside the ops that accepts
  // only backend memory (DeviceEmulationCommunicator): [tagged, tagged+bytes)
  // must lie inside one live allocation, else this prints `who` and `arg` and
  // aborts. nullptr with bytes == 0 passes (returns nullptr).
  void* HostAddress(const void* tagged, int64_t bytes, const char* who, const char* arg) const;

  kernels::DeviceType device() const override { return kernels::DeviceType::kCuda; }
  const char* name() const override { return "device-emulation"; }
  int num_threads() const override { return inner_->num_threads(); }

  kernels::Buffer Allocate(int64_t bytes) override;
  void CopyHostToDevice(void* dst, const void* src, int64_t bytes) override;
  void CopyDeviceToHost(void* dst, const void* src, int64_t bytes) override;
  void CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) override;
  void Fill(float* x, int64_t n, float value) override;
  void Synchronize() override;
  // Bytes of the live allocations (the sizes asked for), as a device's
  // allocator would report them.
  std::optional<DeviceMemoryStats> device_memory() const override;
  void ResetPeakDeviceMemory() override;

  void Axpy(int64_t n, float alpha, const float* x, float* y) override;
  void Scale(int64_t n, float alpha, float* x) override;
  double SumSquares(const float* x, int64_t n) override;

  void Gemm(kernels::Transpose trans_a, kernels::Transpose trans_b, int64_t m, int64_t n,
            int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
            float beta, float* c, int64_t ldc) override;
  kernels::GemmScope SetGemmScope(kernels::GemmScope scope) override;

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
  void AttentionForward(const kernels::AttentionDims& dims, const float* q, const float* k,
                        const float* v, float* out, float* lse) override;
  void AttentionBackward(const kernels::AttentionDims& dims, const float* q, const float* k,
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
  void MoeRoute(const kernels::MoeRouteDims& d, const float* logits, const float* bias, int32_t* expert,
                float* weight, float* scores, float* probs, int32_t* row_of,
                int32_t* assignment_of, int64_t* counts, double* prob_sum) override;
  void MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                  const int32_t* assignment_of, const float* weight, float* out) override;
  void MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                    const int32_t* row_of, const float* weight, float* out) override;
  void MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy,
                   const float* rows, const int32_t* row_of, float* d_weight) override;
  void MoeRouterBackward(const kernels::MoeRouteDims& d, const int32_t* expert, const float* weight,
                         const float* scores, const float* probs, const int64_t* counts,
                         const float* d_weight, double aux_scale, float* d_logits) override;
  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int64_t step) override;

 protected:
  void Free(void* data) override;

 private:
  // The host address behind a tagged pointer that `op` needs as backend
  // memory (argument `arg`); aborts when it is not one. nullptr passes.
  template <typename T>
  T* Dev(T* p, const char* op, const char* arg) const {
    return static_cast<T*>(Untag(const_cast<void*>(static_cast<const void*>(p)), op, arg));
  }
  void* Untag(void* p, const char* op, const char* arg) const;
  // Aborts unless p is an ordinary host address.
  void CheckHost(const void* p, const char* op, const char* arg) const;
  void Count(int64_t Counters::*field, int64_t amount = 1);
  void Trace(const char* op) {
    if (OpTrace* t = trace_.load()) t->Add(op);
  }

  std::unique_ptr<kernels::Ops> inner_;
  mutable std::mutex mu_;
  // Tagged start -> the inner backend's buffer (its size is the buffer's).
  std::map<uintptr_t, kernels::Buffer> live_;
  Counters counters_;
  int64_t allocated_bytes_ = 0;
  int64_t peak_allocated_bytes_ = 0;
  std::atomic<OpTrace*> trace_{nullptr};
};

}  // namespace loom::engine::testing
