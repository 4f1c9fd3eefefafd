// The ops API: every numeric operation the engine's model performs, and the
// memory it performs them on, behind one abstract backend. The model holds an
// `Ops&` and never touches a backend's internals, so the CPU backend (fp32,
// OpenBLAS, OpenMP) and a CUDA backend are interchangeable.
//
// Conventions shared by all ops:
//  - Pointers are backend memory: host memory for the CPU backend, device
//    memory for CUDA. Only Copy* moves bytes between host and backend.
//  - Matrices are row-major. "rows" are tokens (batch * seq, batch-major).
//  - An op writes its outputs unless its comment says it ACCUMULATES (+=);
//    gradient-of-weight outputs always accumulate, so micro-batches add up.
//  - Results are deterministic: same inputs and thread count, same bits.
//
// std-only on purpose: the CUDA harness builds with CUDA and the C++ standard
// library alone.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

namespace loom::kernels {

enum class DeviceType { kCpu, kCuda };
enum class Transpose { kNo, kYes };

class Ops;

// A mixture-of-experts layer's routing problem (docs/moe.md): `tokens` rows of
// router logits over `num_experts` experts, each token choosing `top_k`.
enum class MoeScore { kSoftmax, kSigmoid };
struct MoeRouteDims {
  int64_t tokens = 0;
  int64_t num_experts = 0;
  int64_t top_k = 1;
  int64_t capacity = 0;  // rows an expert keeps per call; 0: dropless
  MoeScore score = MoeScore::kSoftmax;
  double aux_loss_coef = 0.0;  // the backward's load-balancing term (0: none)
};

// Memory owned by a backend; move-only, returned to its backend on
// destruction. Contents are uninitialized after Allocate.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Ops* owner, void* data, int64_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
  ~Buffer() { Reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  float* f32() const { return static_cast<float*>(data_); }
  int32_t* i32() const { return static_cast<int32_t*>(data_); }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }
  void Reset();

 private:
  Ops* owner_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// Attention over q, k, v laid out [batch, seq, heads, head_dim] with a token
// (row) stride, so q, k and v can be column slices of one fused QKV
// projection. Grouped-query: query head h reads kv head h / (num_heads /
// num_kv_heads). The log-sum-exp is [batch, num_heads, seq_q], natural log.
struct AttentionDims {
  int64_t batch = 1;
  int64_t seq_q = 1;
  int64_t seq_kv = 1;
  int64_t num_heads = 1;
  int64_t num_kv_heads = 1;  // divides num_heads
  int64_t head_dim = 1;
  bool causal = true;
  float scale = 1.0f;  // softmax scale, usually 1/sqrt(head_dim)
  // Element strides between consecutive tokens; the gradient of each tensor
  // uses the stride of that tensor (dq like q, ...; d_out like out).
  int64_t q_row_stride = 0;
  int64_t k_row_stride = 0;
  int64_t v_row_stride = 0;
  int64_t o_row_stride = 0;
  // Absolute positions of the first query and first key: under the causal mask
  // key j is visible to query i iff kv_offset + j <= q_offset + i. Non-zero
  // offsets serve sequence-sharded (ring) attention.
  int64_t q_offset = 0;
  int64_t kv_offset = 0;
};

// What the GEMMs issued next compute, so that a backend with a reduced-
// precision recipe (train.precision: fp8) knows which GEMMs run in it and
// which operand is a weight; a backend without one ignores the scope. Inside
// kLinear every Gemm is one of the three GEMMs of a linear layer y = x W^T,
// W stored [out, in] (row-major), x and dy with one row per token:
//   forward  Gemm(kNo,  kYes, tokens, out, in,     x,  W) -> y
//   dgrad    Gemm(kNo,  kNo,  tokens, in,  out,    dy, W) -> dx
//   wgrad    Gemm(kYes, kNo,  out,    in,  tokens, dy, x) -> dW (accumulates)
// so B is the weight exactly when A is not transposed, and the reduction
// runs over `in`, `out` and `tokens` respectively. The LM head, attention and
// everything else stay in kDefault (full precision), as in DeepSeek-V3.
enum class GemmScope { kDefault, kLinear };

class Ops {
 public:
  virtual ~Ops() = default;

  virtual DeviceType device() const = 0;
  virtual const char* name() const = 0;
  // Threads the backend uses (CPU); 1 for devices.
  virtual int num_threads() const = 0;

  // ---- Memory ---------------------------------------------------------------
  virtual Buffer Allocate(int64_t bytes) = 0;
  Buffer AllocateFloats(int64_t n) { return Allocate(n * static_cast<int64_t>(sizeof(float))); }
  virtual void CopyHostToDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual void CopyDeviceToHost(void* dst, const void* src, int64_t bytes) = 0;
  virtual void CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual void Fill(float* x, int64_t n, float value) = 0;
  // Waits until every op issued so far has finished (no-op on CPU).
  virtual void Synchronize() = 0;

  // What a backend with memory of its own (a device's caching allocator)
  // holds for tensors, in bytes; host backends answer nothing, their memory
  // being the process's resident set. ResetPeakDeviceMemory starts a new
  // peak window (the training loop opens one per step).
  struct DeviceMemoryStats {
    int64_t allocated_bytes = 0;
    int64_t peak_allocated_bytes = 0;
    int64_t reserved_bytes = 0;  // allocated + cached: what the driver gave
  };
  virtual std::optional<DeviceMemoryStats> device_memory() const { return std::nullopt; }
  virtual void ResetPeakDeviceMemory() {}

  // ---- Elementwise / reductions ----------------------------------------------
  // y += alpha * x
  virtual void Axpy(int64_t n, float alpha, const float* x, float* y) = 0;
  // x *= alpha
  virtual void Scale(int64_t n, float alpha, float* x) = 0;
  // Sum of squares of x, reduced in a fixed order (for gradient clipping).
  virtual double SumSquares(const float* x, int64_t n) = 0;

  // ---- GEMM ------------------------------------------------------------------
  // C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C, row-major, with
  // leading dimensions as in CBLAS row-major.
  virtual void Gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                    float beta, float* c, int64_t ldc) = 0;

  // Sets the scope of the GEMMs issued from now on (see GemmScope) and returns
  // the previous one. The default keeps no state: full precision always.
  virtual GemmScope SetGemmScope(GemmScope scope) { return GemmScope::kDefault; }

  // ---- Embedding ---------------------------------------------------------------
  // out[t, :] = table[ids[t], :]. ids are backend memory; out is [num_tokens, dim].
  virtual void EmbeddingForward(const int32_t* ids, int64_t num_tokens, const float* table,
                                int64_t vocab, int64_t dim, float* out) = 0;
  // ACCUMULATES d_table[ids[t], :] += d_out[t, :], tokens added in order.
  virtual void EmbeddingBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                                 int64_t vocab, int64_t dim, float* d_table) = 0;

  // ---- RMSNorm -----------------------------------------------------------------
  // y = x * rstd * weight with rstd[r] = 1 / sqrt(mean(x[r,:]^2) + eps).
  virtual void RmsNormForward(const float* x, const float* weight, int64_t rows, int64_t dim,
                              float eps, float* y, float* rstd) = 0;
  // dx = (or += when accumulate_dx) the input gradient; ACCUMULATES d_weight.
  virtual void RmsNormBackward(const float* d_y, const float* x, const float* weight,
                               const float* rstd, int64_t rows, int64_t dim, float* dx,
                               bool accumulate_dx, float* d_weight) = 0;

  // ---- RoPE (Hugging Face Llama rotate-half) -------------------------------------
  // In place on x [batch, seq, heads, head_dim] with token stride row_stride.
  // Token (b, s) has position position_offset + s; cos/sin are
  // [max_positions, head_dim / 2] tables (see MakeRopeTables in rope_tables.h):
  // x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin for the two halves x1, x2.
  virtual void RopeForward(float* x, int64_t batch, int64_t seq, int64_t heads,
                           int64_t head_dim, int64_t row_stride, const float* cos,
                           const float* sin, int64_t position_offset) = 0;
  // In place on the gradient: the inverse rotation.
  virtual void RopeBackward(float* dx, int64_t batch, int64_t seq, int64_t heads,
                            int64_t head_dim, int64_t row_stride, const float* cos,
                            const float* sin, int64_t position_offset) = 0;

  // ---- SwiGLU --------------------------------------------------------------------
  // out[r, c] = silu(gate[r, c]) * up[r, c] for c < dim; gate and up share
  // in_stride (they are halves of one fused projection), out has out_stride.
  virtual void SwiGluForward(int64_t rows, int64_t dim, const float* gate, const float* up,
                             int64_t in_stride, float* out, int64_t out_stride) = 0;
  // d_gate and d_up share in_stride (halves of one fused gradient buffer).
  virtual void SwiGluBackward(int64_t rows, int64_t dim, const float* gate, const float* up,
                              int64_t in_stride, const float* d_out, int64_t out_stride,
                              float* d_gate, float* d_up) = 0;

  // ---- Attention (tiled, online softmax; never materializes S x S) -------------
  // out like q's layout with o_row_stride; lse [batch, num_heads, seq_q].
  virtual void AttentionForward(const AttentionDims& dims, const float* q, const float* k,
                                const float* v, float* out, float* lse) = 0;
  // Overwrites dq, dk, dv. Recomputes P from lse; D = rowsum(d_out * out).
  virtual void AttentionBackward(const AttentionDims& dims, const float* q, const float* k,
                                 const float* v, const float* out, const float* lse,
                                 const float* d_out, float* dq, float* dk, float* dv) = 0;
  // Merges a partial result of the same queries against other keys into an
  // accumulated one by the log-sum-exp rule (ring attention): with
  // L = log(exp(lse) + exp(block_lse)),
  //   out = out * exp(lse - L) + block_out * exp(block_lse - L),  lse = L.
  // out/block_out are [seq, heads, head_dim] with their row strides, lse and
  // block_lse [heads, seq]; a -inf lse (a row that saw no key) contributes
  // nothing. In place on out and lse.
  virtual void AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                              int64_t out_row_stride, float* lse, const float* block_out,
                              int64_t block_row_stride, const float* block_lse) = 0;

  // ---- Strided copy ----------------------------------------------------------------
  // dst[r, 0:cols] = src[r, 0:cols] for r < rows, rows at element strides
  // (gathers a column slice of a fused tensor, or scatters into one).
  virtual void CopyRows(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                        float* dst, int64_t dst_stride) = 0;

  // ---- Cross-entropy fused with softmax -----------------------------------------
  // Rows with target < 0 are ignored (loss 0, gradient 0). row_loss[r] =
  // logsumexp(logits[r]) - logits[r, target[r]].
  virtual void CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                                   int64_t vocab, float* row_loss) = 0;
  // As the forward, and overwrites logits IN PLACE with
  // grad_scale * (softmax(logits) - onehot(target)), so the logits are never
  // stored twice. For the mean loss pass grad_scale = 1 / (valid targets).
  virtual void CrossEntropyForwardBackward(float* logits, const int32_t* targets, int64_t rows,
                                           int64_t vocab, float grad_scale,
                                           float* row_loss) = 0;

  // ---- Vocabulary-parallel embedding and cross-entropy ------------------------------
  // Under tensor parallelism a rank holds vocabulary rows [vocab_offset,
  // vocab_offset + vocab) of the embedding (and LM head), so its logits are
  // those columns only. ids/targets are GLOBAL token ids.
  //
  // out[t, :] = table[ids[t] - vocab_offset, :] when ids[t] falls in the shard,
  // else zeros (summing the shards' outputs over ranks gives the full lookup).
  virtual void EmbeddingShardForward(const int32_t* ids, int64_t num_tokens, const float* table,
                                     int64_t vocab_offset, int64_t vocab, int64_t dim,
                                     float* out) = 0;
  // ACCUMULATES d_table[ids[t] - vocab_offset, :] += d_out[t, :] for the ids in
  // the shard, tokens added in order; other tokens are skipped.
  virtual void EmbeddingShardBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                                      int64_t vocab_offset, int64_t vocab, int64_t dim,
                                      float* d_table) = 0;
  // Per row of the shard's logits [rows, vocab]: row_lse[r] = logsumexp over
  // the shard's columns, and row_target_logit[r] = logits[r, targets[r] -
  // vocab_offset] when the target falls in the shard, else 0 (also for
  // targets < 0). The global log-sum-exp is the logsumexp of the shards'
  // row_lse, and the target logit the sum of the shards' row_target_logit.
  virtual void CrossEntropyShardStats(const float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab_offset, int64_t vocab, float* row_lse,
                                      float* row_target_logit) = 0;
  // Overwrites the shard's logits IN PLACE with grad_scale * (exp(logit -
  // row_lse[r]) - onehot(target)) given the GLOBAL log-sum-exp row_lse; rows
  // with target < 0 get gradient 0.
  virtual void CrossEntropyShardBackward(float* logits, const int32_t* targets, int64_t rows,
                                         int64_t vocab_offset, int64_t vocab,
                                         const float* row_lse, float grad_scale) = 0;

  // ---- Mixture of experts: routing and row movement (docs/moe.md) ------------------
  // Assignment a = t * top_k + j is token t's j-th choice. Every array is
  // backend memory; integers are int32 except the per-expert counts (int64).
  //
  // From logits [tokens, E]: scores = softmax or sigmoid of each row (in
  // double, stored as float), probs = scores normalized per row (softmax:
  // the scores themselves). Token t chooses the top_k experts by
  // score + bias[e] (bias [E] or null; ties go to the lower id) in that
  // order: expert[a], and weight[a] = score / sum of the chosen scores.
  // Capacity: an expert keeps its first `capacity` assignments in assignment
  // order (all when 0); the kept ones, sorted by expert and within an expert
  // by assignment, are the permuted rows: row_of[a] (-1 when dropped) and its
  // inverse assignment_of[row] (kept rows only). counts [2E]: kept rows per
  // expert, then assignments per expert before the drop. prob_sum [E] (double)
  // = sum over tokens of probs[t, e], added in token order.
  virtual void MoeRoute(const MoeRouteDims& d, const float* logits, const float* bias,
                        int32_t* expert, float* weight, float* scores, float* probs,
                        int32_t* row_of, int32_t* assignment_of, int64_t* counts,
                        double* prob_sum) = 0;
  // Token rows to permuted order: out[row, :] = x[assignment_of[row] / top_k, :],
  // times weight[assignment_of[row]] when weight is not null. x [tokens, width].
  virtual void MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                          const int32_t* assignment_of, const float* weight, float* out) = 0;
  // Back to token order, ACCUMULATING: out[t, :] += weight[a] * in[row_of[a], :]
  // for t's kept assignments in j order (weight null: 1). in [rows, width].
  virtual void MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                            const int32_t* row_of, const float* weight, float* out) = 0;
  // The gate weights' gradient: d_weight[a] = dy[t, :] . rows[row_of[a], :]
  // (a dot product in double), 0 for dropped assignments.
  virtual void MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy,
                           const float* rows, const int32_t* row_of, float* d_weight) = 0;
  // d_logits [tokens, E] from d_weight (through the renormalization and the
  // softmax or sigmoid) plus the load-balancing loss's gradient, weighted by
  // aux_scale: d(aux)/d(probs[t, e]) = aux_scale * coef * E * routed_e /
  // (tokens * top_k) / tokens, routed = counts[E .. 2E) of MoeRoute.
  virtual void MoeRouterBackward(const MoeRouteDims& d, const int32_t* expert, const float* weight,
                                 const float* scores, const float* probs, const int64_t* counts,
                                 const float* d_weight, double aux_scale, float* d_logits) = 0;

  // ---- Optimizer -----------------------------------------------------------------
  // torch.optim.AdamW: decoupled decay, bias correction, step counts from 1.
  virtual void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int64_t step) = 0;

 protected:
  friend class Buffer;
  virtual void Free(void* data) = 0;
};

// Puts `ops` in `scope` for the guard's lifetime, then restores the previous
// scope (so nested guards compose).
class GemmScopeGuard {
 public:
  GemmScopeGuard(Ops& ops, GemmScope scope) : ops_(ops), previous_(ops.SetGemmScope(scope)) {}
  ~GemmScopeGuard() { ops_.SetGemmScope(previous_); }
  GemmScopeGuard(const GemmScopeGuard&) = delete;
  GemmScopeGuard& operator=(const GemmScopeGuard&) = delete;

 private:
  Ops& ops_;
  GemmScope previous_;
};

inline Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = other.owner_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.owner_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

inline void Buffer::Reset() {
  if (data_ != nullptr && owner_ != nullptr) owner_->Free(data_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace loom::kernels
