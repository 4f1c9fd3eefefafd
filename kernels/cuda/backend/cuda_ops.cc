// CudaOps: see cuda_ops.h. GEMMs are in cuda_gemm.cc.
#include "kernels/cuda/backend/cuda_ops.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/backend/cuda_lt_state.h"
#include "kernels/cuda/backend/simple_kernels.h"
#include "kernels/cuda/ops/fused_ops.h"
#include "kernels/cuda/ops/moe.h"

namespace loom::kernels::cuda {

std::unique_ptr<CudaOps> CudaOps::Create(const CudaOpsOptions& options, std::string* error) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    *error = std::string("no CUDA device: ") +
             (status != cudaSuccess ? cudaGetErrorString(status) : "cudaGetDeviceCount = 0");
    return nullptr;
  }
  if (options.device < 0 || options.device >= count) {
    *error = "CudaOpsOptions.device = " + std::to_string(options.device) + " is not in [0, " +
             std::to_string(count) + ")";
    return nullptr;
  }
  if ((status = cudaSetDevice(options.device)) != cudaSuccess) {
    *error = std::string("cudaSetDevice: ") + cudaGetErrorString(status);
    return nullptr;
  }
  std::unique_ptr<CudaOps> ops(new CudaOps(options));
  if ((status = cudaStreamCreateWithFlags(&ops->stream_, cudaStreamNonBlocking)) != cudaSuccess) {
    *error = std::string("cudaStreamCreate: ") + cudaGetErrorString(status);
    return nullptr;
  }
  std::string lt_error;
  ops->lt_ = LtState::Create(options.gemm_workspace_bytes, &lt_error);
  if (ops->lt_ == nullptr) {
    *error = lt_error;
    return nullptr;
  }
  return ops;
}

CudaOps::CudaOps(const CudaOpsOptions& options) : options_(options) {
  const int device = options.device;
  allocator_ = std::make_unique<CachingAllocator>(
      [device](int64_t bytes) -> void* {
        void* ptr = nullptr;
        cudaSetDevice(device);
        if (cudaMalloc(&ptr, static_cast<size_t>(bytes)) != cudaSuccess) {
          cudaGetLastError();  // clear the (non-sticky) out-of-memory error
          return nullptr;
        }
        return ptr;
      },
      [device](void* ptr) {
        cudaSetDevice(device);
        cudaFree(ptr);
      });
}

CudaOps::~CudaOps() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  lt_.reset();
  allocator_.reset();  // frees every block: Buffers must not outlive their backend
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaOps::Fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (first_error_.empty()) first_error_ = message;
  }
  if (options_.abort_on_error) {
    std::fprintf(stderr, "CudaOps: %s\n", message.c_str());
    std::abort();
  }
}

bool CudaOps::Check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return true;
  Fail(std::string(what) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
       ")" + (status == cudaErrorInvalidValue ? " - unsupported shape or alignment for this kernel"
                                              : ""));
  return false;
}

bool CudaOps::ok() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return first_error_.empty();
}

std::string CudaOps::error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return first_error_;
}

void CudaOps::RecordEvent(cudaEvent_t event) { Check(cudaEventRecord(event, stream_), "RecordEvent"); }
void CudaOps::WaitEvent(cudaEvent_t event) {
  Check(cudaStreamWaitEvent(stream_, event, 0), "WaitEvent");
}

void CudaOps::EmptyCache() {
  Synchronize();
  allocator_->EmptyCache();
}

// ---- Memory -------------------------------------------------------------------

Buffer CudaOps::Allocate(int64_t bytes) {
  if (bytes <= 0) return Buffer();
  void* ptr = allocator_->Allocate(bytes);
  if (ptr == nullptr) {
    Fail("Allocate(" + std::to_string(bytes) + " bytes): out of device memory (allocated " +
         std::to_string(allocator_->stats().allocated_bytes) + " bytes)");
    return Buffer();
  }
  return Buffer(this, ptr, bytes);
}

Buffer CudaOps::Scratch(int64_t bytes, const char* what) {
  Buffer buffer = Allocate(bytes);
  if (bytes > 0 && buffer.empty()) Fail(std::string(what) + ": no scratch memory");
  return buffer;
}

void CudaOps::Free(void* data) { allocator_->Free(data); }

void CudaOps::CopyHostToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  // Synchronous on purpose: the host buffer may be reused as soon as we return.
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "CopyHostToDevice");
  Check(cudaStreamSynchronize(stream_), "CopyHostToDevice");
}

void CudaOps::CopyDeviceToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "CopyDeviceToHost");
  Check(cudaStreamSynchronize(stream_), "CopyDeviceToHost");
}

void CudaOps::CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "CopyDeviceToDevice");
}

void CudaOps::Fill(float* x, int64_t n, float value) {
  Check(simple::Fill(x, n, value, stream_), "Fill");
}

void CudaOps::Synchronize() { Check(cudaStreamSynchronize(stream_), "Synchronize"); }

// ---- Elementwise ------------------------------------------------------------------

void CudaOps::Axpy(int64_t n, float alpha, const float* x, float* y) {
  Check(simple::Axpy(n, alpha, x, y, stream_), "Axpy");
}

void CudaOps::Scale(int64_t n, float alpha, float* x) {
  Check(simple::Scale(n, alpha, x, stream_), "Scale");
}

double CudaOps::SumSquares(const float* x, int64_t n) {
  Buffer result = Scratch(sizeof(double), "SumSquares");
  if (result.empty()) return 0.0;
  double host = 0.0;
  if (!Check(simple::SumSquares(x, n, static_cast<double*>(result.data()), stream_), "SumSquares"))
    return 0.0;
  CopyDeviceToHost(&host, result.data(), sizeof(double));
  return host;
}

// ---- Embedding --------------------------------------------------------------------

void CudaOps::EmbeddingForward(const int32_t* ids, int64_t num_tokens, const float* table,
                               int64_t vocab, int64_t dim, float* out) {
  Check(simple::EmbeddingForward(ids, num_tokens, table, 0, vocab, dim, out, stream_),
        "EmbeddingForward");
}

void CudaOps::EmbeddingBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                                int64_t vocab, int64_t dim, float* d_table) {
  Check(simple::EmbeddingBackward(ids, num_tokens, d_out, 0, vocab, dim, d_table, stream_),
        "EmbeddingBackward");
}

void CudaOps::EmbeddingShardForward(const int32_t* ids, int64_t num_tokens, const float* table,
                                    int64_t vocab_offset, int64_t vocab, int64_t dim,
                                    float* out) {
  Check(simple::EmbeddingForward(ids, num_tokens, table, vocab_offset, vocab, dim, out, stream_),
        "EmbeddingShardForward");
}

void CudaOps::EmbeddingShardBackward(const int32_t* ids, int64_t num_tokens, const float* d_out,
                                     int64_t vocab_offset, int64_t vocab, int64_t dim,
                                     float* d_table) {
  Check(simple::EmbeddingBackward(ids, num_tokens, d_out, vocab_offset, vocab, dim, d_table,
                                  stream_),
        "EmbeddingShardBackward");
}

// ---- Fused row-wise kernels (kernels/cuda/ops) ----------------------------------------

void CudaOps::RmsNormForward(const float* x, const float* weight, int64_t rows, int64_t dim,
                             float eps, float* y, float* rstd) {
  Check(cuda::RmsNormForward<float>(x, weight, rows, dim, eps, y, rstd, stream_),
        "RmsNormForward (dim must be a multiple of 8, <= 16384)");
}

void CudaOps::RmsNormBackward(const float* d_y, const float* x, const float* weight,
                              const float* rstd, int64_t rows, int64_t dim, float* dx,
                              bool accumulate_dx, float* d_weight) {
  Buffer workspace =
      Scratch(static_cast<int64_t>(cuda::RmsNormBackwardWorkspaceBytes(dim)), "RmsNormBackward");
  Check(cuda::RmsNormBackward<float>(d_y, x, weight, rstd, rows, dim, dx, accumulate_dx, d_weight,
                                     workspace.data(), stream_),
        "RmsNormBackward (dim must be a multiple of 8, <= 16384)");
}

void CudaOps::RopeForward(float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                          int64_t row_stride, const float* cos, const float* sin,
                          int64_t position_offset) {
  Check(cuda::RopeForward<float>(x, batch, seq, heads, head_dim, row_stride, cos, sin,
                                 position_offset, stream_),
        "RopeForward (head_dim must be a multiple of 16, row_stride of 8)");
}

void CudaOps::RopeBackward(float* dx, int64_t batch, int64_t seq, int64_t heads,
                           int64_t head_dim, int64_t row_stride, const float* cos,
                           const float* sin, int64_t position_offset) {
  Check(cuda::RopeBackward<float>(dx, batch, seq, heads, head_dim, row_stride, cos, sin,
                                  position_offset, stream_),
        "RopeBackward (head_dim must be a multiple of 16, row_stride of 8)");
}

void CudaOps::SwiGluForward(int64_t rows, int64_t dim, const float* gate, const float* up,
                            int64_t in_stride, float* out, int64_t out_stride) {
  Check(cuda::SwiGluForward<float>(rows, dim, gate, up, in_stride, out, out_stride, stream_),
        "SwiGluForward (dim and strides must be multiples of 8)");
}

void CudaOps::SwiGluBackward(int64_t rows, int64_t dim, const float* gate, const float* up,
                             int64_t in_stride, const float* d_out, int64_t out_stride,
                             float* d_gate, float* d_up) {
  Check(cuda::SwiGluBackward<float>(rows, dim, gate, up, in_stride, d_out, out_stride, d_gate,
                                    d_up, stream_),
        "SwiGluBackward (dim and strides must be multiples of 8)");
}

// ---- Cross-entropy ------------------------------------------------------------------

void CudaOps::CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                                  int64_t vocab, float* row_loss) {
  Check(cuda::CrossEntropy<float>(logits, targets, rows, vocab, 1.0f, row_loss, nullptr, stream_),
        "CrossEntropyForward (vocab must be a multiple of 8)");
}

void CudaOps::CrossEntropyForwardBackward(float* logits, const int32_t* targets, int64_t rows,
                                          int64_t vocab, float grad_scale, float* row_loss) {
  Check(cuda::CrossEntropy<float>(logits, targets, rows, vocab, grad_scale, row_loss, logits,
                                  stream_),
        "CrossEntropyForwardBackward (vocab must be a multiple of 8)");
}

void CudaOps::CrossEntropyShardStats(const float* logits, const int32_t* targets, int64_t rows,
                                     int64_t vocab_offset, int64_t vocab, float* row_lse,
                                     float* row_target_logit) {
  Check(simple::CrossEntropyShardStats(logits, targets, rows, vocab_offset, vocab, row_lse,
                                       row_target_logit, stream_),
        "CrossEntropyShardStats");
}

void CudaOps::CrossEntropyShardBackward(float* logits, const int32_t* targets, int64_t rows,
                                        int64_t vocab_offset, int64_t vocab,
                                        const float* row_lse, float grad_scale) {
  Check(simple::CrossEntropyShardBackward(logits, targets, rows, vocab_offset, vocab, row_lse,
                                          grad_scale, stream_),
        "CrossEntropyShardBackward");
}

// ---- Optimizer ------------------------------------------------------------------------

// ---- Mixture of experts (kernels/cuda/ops/moe.h) -----------------------------------

void CudaOps::MoeRoute(const MoeRouteDims& d, const float* logits, const float* bias,
                       int32_t* expert, float* weight, float* scores, float* probs,
                       int32_t* row_of, int32_t* assignment_of, int64_t* counts,
                       double* prob_sum) {
  Check(cuda::MoeRoute(d, logits, bias, expert, weight, scores, probs, row_of, assignment_of,
                       counts, prob_sum, stream_),
        "MoeRoute (num_experts <= 1024, top_k <= num_experts)");
}
void CudaOps::MoePermute(int64_t rows, int64_t top_k, int64_t width, const float* x,
                         const int32_t* assignment_of, const float* weight, float* out) {
  Check(cuda::MoePermute(rows, top_k, width, x, assignment_of, weight, out, stream_),
        "MoePermute");
}
void CudaOps::MoeUnpermute(int64_t tokens, int64_t top_k, int64_t width, const float* in,
                           const int32_t* row_of, const float* weight, float* out) {
  Check(cuda::MoeUnpermute(tokens, top_k, width, in, row_of, weight, out, stream_),
        "MoeUnpermute");
}
void CudaOps::MoeGateGrad(int64_t tokens, int64_t top_k, int64_t width, const float* dy,
                          const float* rows, const int32_t* row_of, float* d_weight) {
  Check(cuda::MoeGateGrad(tokens, top_k, width, dy, rows, row_of, d_weight, stream_),
        "MoeGateGrad");
}
void CudaOps::MoeRouterBackward(const MoeRouteDims& d, const int32_t* expert, const float* weight,
                                const float* scores, const float* probs, const int64_t* counts,
                                const float* d_weight, double aux_scale, float* d_logits) {
  Check(cuda::MoeRouterBackward(d, expert, weight, scores, probs, counts, d_weight, aux_scale,
                                d_logits, stream_),
        "MoeRouterBackward (num_experts <= 1024, top_k <= num_experts)");
}

void CudaOps::AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  AdamWTensor tensor;
  tensor.param = param;
  tensor.grad = grad;
  tensor.m = m;
  tensor.v = v;
  tensor.n = n;
  AdamWHyper hyper;
  hyper.lr = lr;
  hyper.beta1 = beta1;
  hyper.beta2 = beta2;
  hyper.eps = eps;
  hyper.weight_decay = weight_decay;
  hyper.step = step;
  Check(MultiTensorAdamW({tensor}, hyper, stream_), "AdamW");
}

}  // namespace loom::kernels::cuda
