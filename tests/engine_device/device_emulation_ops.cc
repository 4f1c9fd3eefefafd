#include "tests/engine_device/device_emulation_ops.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace loom::engine::testing {
namespace {

using kernels::AttentionDims;
using kernels::GemmScope;
using kernels::Transpose;

[[noreturn]] void DieAs(const char* who, const char* arg, const void* p, const char* why) {
  std::fprintf(stderr, "%s: argument %s = %p %s\n", who, arg, p, why);
  std::abort();
}

[[noreturn]] void Die(const char* op, const char* arg, const void* p, const char* why) {
  std::fprintf(stderr, "DeviceEmulationOps::%s: argument %s = %p %s\n", op, arg, p, why);
  std::abort();
}

}  // namespace

DeviceEmulationOps::DeviceEmulationOps(std::unique_ptr<kernels::Ops> inner)
    : inner_(std::move(inner)) {}

DeviceEmulationOps::~DeviceEmulationOps() = default;

DeviceEmulationOps::Counters DeviceEmulationOps::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void DeviceEmulationOps::Count(int64_t Counters::*field, int64_t amount) {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.*field += amount;
  ++counters_.ops;
}

void* DeviceEmulationOps::Untag(void* p, const char* op, const char* arg) const {
  if (p == nullptr) return nullptr;
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  if ((address & kTag) == 0) {
    Die(op, arg, p, "is host memory where the op needs backend (device) memory");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(address);
  if (it == live_.begin()) Die(op, arg, p, "is not inside any live allocation");
  --it;
  if (address > it->first + static_cast<uintptr_t>(it->second.bytes())) {
    Die(op, arg, p, "is not inside any live allocation (freed, or past the end)");
  }
  return reinterpret_cast<void*>(address - kTag);
}

void* DeviceEmulationOps::HostAddress(const void* tagged, int64_t bytes, const char* who,
                                      const char* arg) const {
  if (tagged == nullptr && bytes == 0) return nullptr;
  const uintptr_t address = reinterpret_cast<uintptr_t>(tagged);
  if ((address & kTag) == 0) {
    DieAs(who, arg, tagged, "is host memory where backend (device) memory is required");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(address);
  if (it == live_.begin()) DieAs(who, arg, tagged, "is not inside any live allocation");
  --it;
  const uintptr_t end = it->first + static_cast<uintptr_t>(it->second.bytes());
  if (address > end || static_cast<uintptr_t>(bytes) > end - address) {
    DieAs(who, arg, tagged, "does not lie inside one live allocation (freed, or past the end)");
  }
  return reinterpret_cast<void*>(address - kTag);
}

void DeviceEmulationOps::CheckHost(const void* p, const char* op, const char* arg) const {
  if (IsDevicePointer(p)) Die(op, arg, p, "is backend (device) memory where the op needs host memory");
}

kernels::Buffer DeviceEmulationOps::Allocate(int64_t bytes) {
  kernels::Buffer real = inner_->Allocate(bytes);
  if (real.empty()) return kernels::Buffer();
  const uintptr_t address = reinterpret_cast<uintptr_t>(real.data());
  if ((address & kTag) != 0) {
    std::fprintf(stderr, "DeviceEmulationOps: host address %p already has bit 47 set\n", real.data());
    std::abort();
  }
  const uintptr_t tagged = address + kTag;
  std::lock_guard<std::mutex> lock(mu_);
  live_.emplace(tagged, std::move(real));
  allocated_bytes_ += bytes;
  peak_allocated_bytes_ = std::max(peak_allocated_bytes_, allocated_bytes_);
  ++counters_.allocations;
  ++counters_.live_allocations;
  return kernels::Buffer(this, reinterpret_cast<void*>(tagged), bytes);
}

std::optional<kernels::Ops::DeviceMemoryStats> DeviceEmulationOps::device_memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return DeviceMemoryStats{allocated_bytes_, peak_allocated_bytes_, allocated_bytes_};
}

void DeviceEmulationOps::ResetPeakDeviceMemory() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_allocated_bytes_ = allocated_bytes_;
}

void DeviceEmulationOps::Free(void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(data));
  if (it == live_.end()) Die("Free", "data", data, "was not allocated here (or freed twice)");
  allocated_bytes_ -= it->second.bytes();
  live_.erase(it);  // the inner Buffer returns the memory to the inner backend
  --counters_.live_allocations;
}

void DeviceEmulationOps::CopyHostToDevice(void* dst, const void* src, int64_t bytes) {
  CheckHost(src, "CopyHostToDevice", "src");
  inner_->CopyHostToDevice(Dev(dst, "CopyHostToDevice", "dst"), src, bytes);
  Count(&Counters::host_to_device_bytes, bytes);
}

void DeviceEmulationOps::CopyDeviceToHost(void* dst, const void* src, int64_t bytes) {
  CheckHost(dst, "CopyDeviceToHost", "dst");
  inner_->CopyDeviceToHost(dst, Dev(src, "CopyDeviceToHost", "src"), bytes);
  Count(&Counters::device_to_host_bytes, bytes);
}

void DeviceEmulationOps::CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) {
  inner_->CopyDeviceToDevice(Dev(dst, "CopyDeviceToDevice", "dst"),
                             Dev(src, "CopyDeviceToDevice", "src"), bytes);
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::Fill(float* x, int64_t n, float value) {
  inner_->Fill(Dev(x, "Fill", "x"), n, value);
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::Synchronize() { inner_->Synchronize(); }

void DeviceEmulationOps::Axpy(int64_t n, float alpha, const float* x, float* y) {
  inner_->Axpy(n, alpha, Dev(x, "Axpy", "x"), Dev(y, "Axpy", "y"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::Scale(int64_t n, float alpha, float* x) {
  inner_->Scale(n, alpha, Dev(x, "Scale", "x"));
  Count(&Counters::scale);
}

double DeviceEmulationOps::SumSquares(const float* x, int64_t n) {
  const double result = inner_->SumSquares(Dev(x, "SumSquares", "x"), n);
  Count(&Counters::sum_squares);
  return result;
}

void DeviceEmulationOps::Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n,
                              int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                              int64_t ldb, float beta, float* c, int64_t ldc) {
  inner_->Gemm(trans_a, trans_b, m, n, k, alpha, Dev(a, "Gemm", "a"), lda, Dev(b, "Gemm", "b"),
               ldb, beta, Dev(c, "Gemm", "c"), ldc);
  Count(&Counters::ops, 0);
}

GemmScope DeviceEmulationOps::SetGemmScope(GemmScope scope) { return inner_->SetGemmScope(scope); }

void DeviceEmulationOps::EmbeddingForward(const int32_t* ids, int64_t num_tokens,
                                          const float* table, int64_t vocab, int64_t dim,
                                          float* out) {
  inner_->EmbeddingForward(Dev(ids, "EmbeddingForward", "ids"), num_tokens,
                           Dev(table, "EmbeddingForward", "table"), vocab, dim,
                           Dev(out, "EmbeddingForward", "out"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::EmbeddingBackward(const int32_t* ids, int64_t num_tokens,
                                           const float* d_out, int64_t vocab, int64_t dim,
                                           float* d_table) {
  inner_->EmbeddingBackward(Dev(ids, "EmbeddingBackward", "ids"), num_tokens,
                            Dev(d_out, "EmbeddingBackward", "d_out"), vocab, dim,
                            Dev(d_table, "EmbeddingBackward", "d_table"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::RmsNormForward(const float* x, const float* weight, int64_t rows,
                                        int64_t dim, float eps, float* y, float* rstd) {
  inner_->RmsNormForward(Dev(x, "RmsNormForward", "x"), Dev(weight, "RmsNormForward", "weight"),
                         rows, dim, eps, Dev(y, "RmsNormForward", "y"),
                         Dev(rstd, "RmsNormForward", "rstd"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::RmsNormBackward(const float* d_y, const float* x, const float* weight,
                                         const float* rstd, int64_t rows, int64_t dim, float* dx,
                                         bool accumulate_dx, float* d_weight) {
  const char* op = "RmsNormBackward";
  inner_->RmsNormBackward(Dev(d_y, op, "d_y"), Dev(x, op, "x"), Dev(weight, op, "weight"),
                          Dev(rstd, op, "rstd"), rows, dim, Dev(dx, op, "dx"), accumulate_dx,
                          Dev(d_weight, op, "d_weight"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::RopeForward(float* x, int64_t batch, int64_t seq, int64_t heads,
                                     int64_t head_dim, int64_t row_stride, const float* cos,
                                     const float* sin, int64_t position_offset) {
  const char* op = "RopeForward";
  inner_->RopeForward(Dev(x, op, "x"), batch, seq, heads, head_dim, row_stride,
                      Dev(cos, op, "cos"), Dev(sin, op, "sin"), position_offset);
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::RopeBackward(float* dx, int64_t batch, int64_t seq, int64_t heads,
                                      int64_t head_dim, int64_t row_stride, const float* cos,
                                      const float* sin, int64_t position_offset) {
  const char* op = "RopeBackward";
  inner_->RopeBackward(Dev(dx, op, "dx"), batch, seq, heads, head_dim, row_stride,
                       Dev(cos, op, "cos"), Dev(sin, op, "sin"), position_offset);
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::SwiGluForward(int64_t rows, int64_t dim, const float* gate,
                                       const float* up, int64_t in_stride, float* out,
                                       int64_t out_stride) {
  const char* op = "SwiGluForward";
  inner_->SwiGluForward(rows, dim, Dev(gate, op, "gate"), Dev(up, op, "up"), in_stride,
                        Dev(out, op, "out"), out_stride);
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::SwiGluBackward(int64_t rows, int64_t dim, const float* gate,
                                        const float* up, int64_t in_stride, const float* d_out,
                                        int64_t out_stride, float* d_gate, float* d_up) {
  const char* op = "SwiGluBackward";
  inner_->SwiGluBackward(rows, dim, Dev(gate, op, "gate"), Dev(up, op, "up"), in_stride,
                         Dev(d_out, op, "d_out"), out_stride, Dev(d_gate, op, "d_gate"),
                         Dev(d_up, op, "d_up"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::AttentionForward(const AttentionDims& dims, const float* q,
                                          const float* k, const float* v, float* out,
                                          float* lse) {
  const char* op = "AttentionForward";
  Trace(op);
  inner_->AttentionForward(dims, Dev(q, op, "q"), Dev(k, op, "k"), Dev(v, op, "v"),
                           Dev(out, op, "out"), Dev(lse, op, "lse"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::AttentionBackward(const AttentionDims& dims, const float* q,
                                           const float* k, const float* v, const float* out,
                                           const float* lse, const float* d_out, float* dq,
                                           float* dk, float* dv) {
  const char* op = "AttentionBackward";
  Trace(op);
  inner_->AttentionBackward(dims, Dev(q, op, "q"), Dev(k, op, "k"), Dev(v, op, "v"),
                            Dev(out, op, "out"), Dev(lse, op, "lse"), Dev(d_out, op, "d_out"),
                            Dev(dq, op, "dq"), Dev(dk, op, "dk"), Dev(dv, op, "dv"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                                        int64_t out_row_stride, float* lse,
                                        const float* block_out, int64_t block_row_stride,
                                        const float* block_lse) {
  const char* op = "AttentionMerge";
  Trace(op);
  inner_->AttentionMerge(seq, heads, head_dim, Dev(out, op, "out"), out_row_stride,
                         Dev(lse, op, "lse"), Dev(block_out, op, "block_out"), block_row_stride,
                         Dev(block_lse, op, "block_lse"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::CopyRows(int64_t rows, int64_t cols, const float* src,
                                  int64_t src_stride, float* dst, int64_t dst_stride) {
  const char* op = "CopyRows";
  inner_->CopyRows(rows, cols, Dev(src, op, "src"), src_stride, Dev(dst, op, "dst"), dst_stride);
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::CrossEntropyForward(const float* logits, const int32_t* targets,
                                             int64_t rows, int64_t vocab, float* row_loss) {
  const char* op = "CrossEntropyForward";
  inner_->CrossEntropyForward(Dev(logits, op, "logits"), Dev(targets, op, "targets"), rows, vocab,
                              Dev(row_loss, op, "row_loss"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::CrossEntropyForwardBackward(float* logits, const int32_t* targets,
                                                     int64_t rows, int64_t vocab,
                                                     float grad_scale, float* row_loss) {
  const char* op = "CrossEntropyForwardBackward";
  inner_->CrossEntropyForwardBackward(Dev(logits, op, "logits"), Dev(targets, op, "targets"),
                                      rows, vocab, grad_scale, Dev(row_loss, op, "row_loss"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::EmbeddingShardForward(const int32_t* ids, int64_t num_tokens,
                                               const float* table, int64_t vocab_offset,
                                               int64_t vocab, int64_t dim, float* out) {
  const char* op = "EmbeddingShardForward";
  inner_->EmbeddingShardForward(Dev(ids, op, "ids"), num_tokens, Dev(table, op, "table"),
                                vocab_offset, vocab, dim, Dev(out, op, "out"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::EmbeddingShardBackward(const int32_t* ids, int64_t num_tokens,
                                                const float* d_out, int64_t vocab_offset,
                                                int64_t vocab, int64_t dim, float* d_table) {
  const char* op = "EmbeddingShardBackward";
  inner_->EmbeddingShardBackward(Dev(ids, op, "ids"), num_tokens, Dev(d_out, op, "d_out"),
                                 vocab_offset, vocab, dim, Dev(d_table, op, "d_table"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::CrossEntropyShardStats(const float* logits, const int32_t* targets,
                                                int64_t rows, int64_t vocab_offset, int64_t vocab,
                                                float* row_lse, float* row_target_logit) {
  const char* op = "CrossEntropyShardStats";
  inner_->CrossEntropyShardStats(Dev(logits, op, "logits"), Dev(targets, op, "targets"), rows,
                                 vocab_offset, vocab, Dev(row_lse, op, "row_lse"),
                                 Dev(row_target_logit, op, "row_target_logit"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::CrossEntropyShardBackward(float* logits, const int32_t* targets,
                                                   int64_t rows, int64_t vocab_offset,
                                                   int64_t vocab, const float* row_lse,
                                                   float grad_scale) {
  const char* op = "CrossEntropyShardBackward";
  inner_->CrossEntropyShardBackward(Dev(logits, op, "logits"), Dev(targets, op, "targets"), rows,
                                    vocab_offset, vocab, Dev(row_lse, op, "row_lse"), grad_scale);
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::MoeRoute(const kernels::MoeRouteDims& d, const float* logits,
                                  const float* bias, int32_t* expert, float* weight,
                                  float* scores, float* probs, int32_t* row_of,
                                  int32_t* assignment_of, int64_t* counts, double* prob_sum) {
  const char* op = "MoeRoute";
  inner_->MoeRoute(d, Dev(logits, op, "logits"), Dev(bias, op, "bias"), Dev(expert, op, "expert"),
                   Dev(weight, op, "weight"), Dev(scores, op, "scores"), Dev(probs, op, "probs"),
                   Dev(row_of, op, "row_of"), Dev(assignment_of, op, "assignment_of"),
                   Dev(counts, op, "counts"), Dev(prob_sum, op, "prob_sum"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                                    const int32_t* assignment_of, const float* weight,
                                    float* out) {
  const char* op = "MoePermute";
  inner_->MoePermute(rows, top_k, width, Dev(x, op, "x"), Dev(assignment_of, op, "assignment_of"),
                     Dev(weight, op, "weight"), Dev(out, op, "out"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width,
                                      const float* in, const int32_t* row_of, const float* weight,
                                      float* out) {
  const char* op = "MoeUnpermute";
  inner_->MoeUnpermute(tokens, top_k, width, Dev(in, op, "in"), Dev(row_of, op, "row_of"),
                       Dev(weight, op, "weight"), Dev(out, op, "out"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width,
                                     const float* dy, const float* rows, const int32_t* row_of,
                                     float* d_weight) {
  const char* op = "MoeGateGrad";
  inner_->MoeGateGrad(tokens, top_k, width, Dev(dy, op, "dy"), Dev(rows, op, "rows"),
                      Dev(row_of, op, "row_of"), Dev(d_weight, op, "d_weight"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::MoeRouterBackward(const kernels::MoeRouteDims& d, const int32_t* expert,
                                           const float* weight, const float* scores,
                                           const float* probs, const int64_t* counts,
                                           const float* d_weight, double aux_scale,
                                           float* d_logits) {
  const char* op = "MoeRouterBackward";
  inner_->MoeRouterBackward(d, Dev(expert, op, "expert"), Dev(weight, op, "weight"),
                            Dev(scores, op, "scores"), Dev(probs, op, "probs"),
                            Dev(counts, op, "counts"), Dev(d_weight, op, "d_weight"), aux_scale,
                            Dev(d_logits, op, "d_logits"));
  Count(&Counters::ops, 0);
}

void DeviceEmulationOps::AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay,
                               int64_t step) {
  const char* op = "AdamW";
  inner_->AdamW(Dev(param, op, "param"), Dev(grad, op, "grad"), Dev(m, op, "m"), Dev(v, op, "v"),
                n, lr, beta1, beta2, eps, weight_decay, step);
  Count(&Counters::adamw);
}

}  // namespace loom::engine::testing
