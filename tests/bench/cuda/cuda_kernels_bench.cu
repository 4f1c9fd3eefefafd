// Dev benchmark of the CUDA kernels and their variants, std-only (the device
// harness builds it with plain nvcc). Times each with CUDA events (warm-up,
// then the median of several runs) on random data, and prints one row per
// kernel/variant: time, TFLOP/s for the matrix kernels, GB/s (bytes read +
// written once) for the memory-bound ones. No GPU: prints SKIP and exits 0.
//
//   cuda_kernels_bench [filter]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/fp8/fp8.h"
#include "kernels/cuda/ops/fused_ops.h"
#include "kernels/cuda/ops/moe.h"

namespace {

namespace kc = loom::kernels::cuda;
using bf16 = __nv_bfloat16;

#define BENCH_CHECK(expr)                                                                          \
  do {                                                                                             \
    cudaError_t e_ = (expr);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

__global__ void FillRandom(bf16* x, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = __float2bfloat16(scale * ((h & 0xffffff) / 8388608.0f - 1.0f) + 1e-3f);
  }
}
__global__ void FillRandomF(float* x, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = scale * ((h & 0xffffff) / 8388608.0f - 1.0f) + 1e-3f;
  }
}

template <typename T>
T* Alloc(size_t n) {
  T* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}
bf16* RandomBf16(size_t n, uint32_t seed, float scale = 1.f) {
  bf16* p = Alloc<bf16>(n);
  FillRandom<<<1024, 256>>>(p, n, seed, scale);
  BENCH_CHECK(cudaGetLastError());
  return p;
}
float* RandomF32(size_t n, uint32_t seed, float scale = 1.f) {
  float* p = Alloc<float>(n);
  FillRandomF<<<1024, 256>>>(p, n, seed, scale);
  BENCH_CHECK(cudaGetLastError());
  return p;
}

// Median milliseconds of `reps` timed runs after `warmup` untimed ones.
double TimeMs(const std::function<cudaError_t()>& fn, int warmup = 3, int reps = 10) {
  for (int i = 0; i < warmup; ++i) BENCH_CHECK(fn());
  BENCH_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    BENCH_CHECK(cudaEventRecord(a));
    BENCH_CHECK(fn());
    BENCH_CHECK(cudaEventRecord(b));
    BENCH_CHECK(cudaEventSynchronize(b));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void Row(const char* kernel, const std::string& variant, const std::string& shape, double ms, double flops,
         double bytes) {
  std::printf("BENCH | %-18s | %-14s | %-26s | %9.3f ms | %8.1f TFLOP/s | %7.0f GB/s\n", kernel, variant.c_str(),
              shape.c_str(), ms, flops > 0 ? flops / ms / 1e9 : 0.0, bytes > 0 ? bytes / ms / 1e6 : 0.0);
  std::fflush(stdout);
}

bool Want(const char* filter, const char* name) { return filter == nullptr || std::strstr(name, filter) != nullptr; }

void BenchAttention() {
  const int b = 4, s = 4096, h = 16;
  for (int d : {128, 64}) {
    loom::kernels::AttentionDims dims;
    dims.batch = b;
    dims.seq_q = dims.seq_kv = s;
    dims.num_heads = dims.num_kv_heads = h;
    dims.head_dim = d;
    dims.scale = 1.0f / std::sqrt(static_cast<float>(d));
    dims.q_row_stride = dims.k_row_stride = dims.v_row_stride = dims.o_row_stride = h * d;
    const size_t n = static_cast<size_t>(b) * s * h * d;
    bf16 *q = RandomBf16(n, 1), *k = RandomBf16(n, 2), *v = RandomBf16(n, 3), *o = Alloc<bf16>(n),
         *d_o = RandomBf16(n, 4), *dq = Alloc<bf16>(n), *dk = Alloc<bf16>(n), *dv = Alloc<bf16>(n);
    float* lse = Alloc<float>(static_cast<size_t>(b) * h * s);
    void* ws = Alloc<unsigned char>(kc::AttentionBackwardWorkspaceBytes(dims));
    for (bool causal : {false, true}) {
      dims.causal = causal;
      const double fwd_flops = 4.0 * b * h * static_cast<double>(s) * s * d / (causal ? 2 : 1);
      const std::string shape = "b4 s4096 h16 d" + std::to_string(d) + (causal ? " causal" : " full");
      for (int bm : d == 128 ? std::vector<int>{64, 128} : std::vector<int>{128}) {
        const double ms = TimeMs([&] { return kc::AttentionForward(dims, q, k, v, o, lse, nullptr, bm); });
        Row("attention fwd", "bm" + std::to_string(bm), shape, ms, fwd_flops, 0);
      }
      BENCH_CHECK(kc::AttentionForward(dims, q, k, v, o, lse, nullptr));
      const double ms = TimeMs([&] { return kc::AttentionBackward(dims, q, k, v, o, lse, d_o, dq, dk, dv, ws, nullptr); });
      Row("attention bwd", "bm64 bn64", shape, ms, 2.5 * fwd_flops, 0);
    }
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)d_o, (void*)dq, (void*)dk, (void*)dv, (void*)lse, ws})
      cudaFree(p);
  }
}

void BenchFp8() {
  for (int size : {4096, 8192}) {
    const int m = size, n = size, k = size;
    bf16* x = RandomBf16(static_cast<size_t>(m) * k, 5);
    bf16* w = RandomBf16(static_cast<size_t>(n) * k, 6, 0.05f);
    uint8_t* qa = Alloc<uint8_t>(static_cast<size_t>(m) * k);
    uint8_t* qb = Alloc<uint8_t>(static_cast<size_t>(n) * k);
    float* sa = Alloc<float>(static_cast<size_t>(m) * k / 128);
    float* sb = Alloc<float>(static_cast<size_t>(n) * k / 128);  // big enough for either layout
    bf16* out = Alloc<bf16>(static_cast<size_t>(m) * n);
    const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    const double elems = static_cast<double>(m) * k;
    double ms = TimeMs([&] { return kc::QuantizeActivationFp8(x, m, k, false, qa, sa, nullptr); });
    Row("fp8 quant act", "1x128", shape, ms, 0, elems * 3 + elems / 32);
    ms = TimeMs([&] { return kc::QuantizeActivationFp8(x, m, k, true, qa, sa, nullptr); });
    Row("fp8 quant act", "1x128 transp", shape, ms, 0, elems * 3 + elems / 32);
    ms = TimeMs([&] { return kc::QuantizeWeightFp8(w, n, k, false, qb, sb, nullptr); });
    Row("fp8 quant weight", "128x128", shape, ms, 0, elems * 3);
    BENCH_CHECK(kc::QuantizeActivationFp8(x, m, k, false, qa, sa, nullptr));
    BENCH_CHECK(kc::QuantizeWeightFp8(w, n, k, false, qb, sb, nullptr));
    const double flops = 2.0 * m * n * k;
    for (auto [impl, name] : {std::pair{kc::Fp8GemmImpl::kMmaSync, "mma.sync f16"}, std::pair{kc::Fp8GemmImpl::kWgmma, "wgmma e4m3"}}) {
      ms = TimeMs([&] { return kc::Fp8BlockScaledGemm(qa, sa, qb, sb, kc::Fp8BScales::kBlock128x128, m, n, k, out, nullptr, impl); });
      Row("fp8 gemm", name, shape, ms, flops, 0);
    }
    for (void* p : {(void*)x, (void*)w, (void*)qa, (void*)qb, (void*)sa, (void*)sb, (void*)out}) cudaFree(p);
  }
}

void BenchOps() {
  const int64_t rows = 16384, dim = 8192;
  const size_t n = static_cast<size_t>(rows) * dim;
  bf16 *x = RandomBf16(n, 7), *y = Alloc<bf16>(n), *dy = RandomBf16(n, 8), *dx = Alloc<bf16>(n);
  float *w = RandomF32(dim, 9), *rstd = Alloc<float>(rows), *dw = Alloc<float>(dim);
  void* ws = Alloc<unsigned char>(kc::RmsNormBackwardWorkspaceBytes(dim));
  double ms = TimeMs([&] { return kc::RmsNormForward<bf16>(x, w, rows, dim, 1e-5f, y, rstd, nullptr); });
  Row("rmsnorm fwd", "bf16", "16384x8192", ms, 0, 2.0 * n * 2);
  ms = TimeMs([&] { return kc::RmsNormBackward<bf16>(dy, x, w, rstd, rows, dim, dx, false, dw, ws, nullptr); });
  Row("rmsnorm bwd", "bf16", "16384x8192", ms, 0, 3.0 * n * 2);

  // RoPE over q of 16384 tokens x 64 heads x 128 (in place: read + write).
  const int64_t max_pos = 4096;
  float *cos_t = RandomF32(max_pos * 64, 10), *sin_t = RandomF32(max_pos * 64, 11);
  ms = TimeMs([&] { return kc::RopeForward<bf16>(x, 4, 4096, 64, 128, 64 * 128, cos_t, sin_t, 0, nullptr); });
  Row("rope fwd", "bf16", "4x4096x64x128", ms, 0, 2.0 * n * 2);

  // SwiGLU on [16384, 2 x 4096] -> [16384, 4096].
  ms = TimeMs([&] { return kc::SwiGluForward<bf16>(rows, dim / 2, x, x + dim / 2, dim, y, dim / 2, nullptr); });
  Row("swiglu fwd", "bf16", "16384x4096", ms, 0, 1.5 * n * 2);
  ms = TimeMs([&] { return kc::SwiGluBackward<bf16>(rows, dim / 2, x, x + dim / 2, dim, dy, dim / 2, dx, dx + dim / 2, nullptr); });
  Row("swiglu bwd", "bf16", "16384x4096", ms, 0, 2.5 * n * 2);  // read g, u, dy; write dg, du
  cudaFree(x); cudaFree(y); cudaFree(dy); cudaFree(dx); cudaFree(w); cudaFree(rstd); cudaFree(dw); cudaFree(ws);
  cudaFree(cos_t); cudaFree(sin_t);

  // Cross-entropy over 8192 tokens x 128256 vocab (Llama 3), loss + in-place gradient.
  const int64_t tokens = 8192, vocab = 128256;
  bf16* logits = RandomBf16(static_cast<size_t>(tokens) * vocab, 12, 5.f);
  int32_t* targets = Alloc<int32_t>(tokens);
  std::vector<int32_t> ht(tokens);
  for (int64_t i = 0; i < tokens; ++i) ht[i] = static_cast<int32_t>((i * 7919) % vocab);
  BENCH_CHECK(cudaMemcpy(targets, ht.data(), tokens * 4, cudaMemcpyHostToDevice));
  float* loss = Alloc<float>(tokens);
  ms = TimeMs([&] { return kc::CrossEntropy<bf16>(logits, targets, tokens, vocab, 1.f / tokens, loss, nullptr, nullptr); });
  Row("cross-entropy", "loss only", "8192x128256", ms, 0, 2.0 * tokens * vocab);
  ms = TimeMs([&] { return kc::CrossEntropy<bf16>(logits, targets, tokens, vocab, 1.f / tokens, loss, logits, nullptr); });
  Row("cross-entropy", "loss+grad", "8192x128256", ms, 0, 3.0 * 2 * tokens * vocab);
  cudaFree(logits); cudaFree(targets); cudaFree(loss);

  // AdamW: 200 tensors, 256M parameters in all.
  std::vector<kc::AdamWTensor> tensors;
  std::vector<float*> owned;
  const int64_t per = (256ll << 20) / 200;
  for (int i = 0; i < 200; ++i) {
    kc::AdamWTensor t;
    t.param = RandomF32(per, 20 + i);
    t.grad = RandomF32(per, 420 + i, 0.01f);
    t.m = RandomF32(per, 820 + i, 0.001f);
    t.v = RandomF32(per, 1220 + i, 0.0001f);
    t.n = per;
    owned.insert(owned.end(), {t.param, const_cast<float*>(t.grad), t.m, t.v});
    tensors.push_back(t);
  }
  kc::AdamWHyper hyper;
  ms = TimeMs([&] { return kc::MultiTensorAdamW(tensors, hyper, nullptr); });
  Row("adamw", "200 tensors", "256M params fp32", ms, 0, 7.0 * 4 * per * 200);
  for (float* p : owned) cudaFree(p);
}

// The MoE layer's routing and row movement at a DeepSeek-V3-like layer on one
// device: 16384 tokens, 256 experts, top 8 by sigmoid, hidden 4096 (fp32 rows).
void BenchMoe() {
  loom::kernels::MoeRouteDims d;
  d.tokens = 16384;
  d.num_experts = 256;
  d.top_k = 8;
  d.score = loom::kernels::MoeScore::kSigmoid;
  d.aux_loss_coef = 1e-4;
  const int64_t width = 4096, assignments = d.tokens * d.top_k;
  float *logits = RandomF32(d.tokens * d.num_experts, 30, 2.f), *bias = RandomF32(d.num_experts, 31, 0.01f);
  float *weight = Alloc<float>(assignments), *scores = Alloc<float>(d.tokens * d.num_experts),
        *probs = Alloc<float>(d.tokens * d.num_experts), *d_weight = Alloc<float>(assignments),
        *d_logits = Alloc<float>(d.tokens * d.num_experts);
  int32_t *expert = Alloc<int32_t>(assignments), *row_of = Alloc<int32_t>(assignments),
          *assignment_of = Alloc<int32_t>(assignments);
  int64_t* counts = Alloc<int64_t>(2 * d.num_experts);
  double* prob_sum = Alloc<double>(d.num_experts);
  float *x = RandomF32(d.tokens * width, 32), *rows = Alloc<float>(assignments * width),
        *y = RandomF32(d.tokens * width, 33);
  const std::string shape = "16384 tok E256 k8";
  double ms = TimeMs([&] {
    return kc::MoeRoute(d, logits, bias, expert, weight, scores, probs, row_of, assignment_of,
                        counts, prob_sum, nullptr);
  });
  const double te_bytes = 4.0 * d.tokens * d.num_experts;
  Row("moe route", "sigmoid+bias", shape, ms, 0, 3 * te_bytes + 16.0 * assignments);
  const std::string row_shape = shape + " h4096";
  const double row_bytes = 4.0 * assignments * width;
  ms = TimeMs([&] { return kc::MoePermute(assignments, d.top_k, width, x, assignment_of, nullptr, rows, nullptr); });
  Row("moe permute", "gather", row_shape, ms, 0, 2 * row_bytes);
  ms = TimeMs([&] { return kc::MoePermute(assignments, d.top_k, width, x, assignment_of, weight, rows, nullptr); });
  Row("moe permute", "gather*weight", row_shape, ms, 0, 2 * row_bytes);
  ms = TimeMs([&] { return kc::MoeUnpermute(d.tokens, d.top_k, width, rows, row_of, weight, y, nullptr); });
  Row("moe unpermute", "weighted sum", row_shape, ms, 0, row_bytes + 8.0 * d.tokens * width);
  ms = TimeMs([&] { return kc::MoeGateGrad(d.tokens, d.top_k, width, y, rows, row_of, d_weight, nullptr); });
  Row("moe gate grad", "dot fp64", row_shape, ms, 0, row_bytes + 4.0 * d.tokens * width);
  ms = TimeMs([&] {
    return kc::MoeRouterBackward(d, expert, weight, scores, probs, counts, d_weight, 1.0, d_logits, nullptr);
  });
  Row("moe router bwd", "sigmoid", shape, ms, 0, 3 * te_bytes + 12.0 * assignments);
  for (void* p : {(void*)logits, (void*)bias, (void*)weight, (void*)scores, (void*)probs, (void*)d_weight,
                  (void*)d_logits, (void*)expert, (void*)row_of, (void*)assignment_of, (void*)counts,
                  (void*)prob_sum, (void*)x, (void*)rows, (void*)y})
    cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  const char* filter = argc > 1 ? argv[1] : nullptr;
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  if (Want(filter, "attention")) BenchAttention();
  if (Want(filter, "fp8")) BenchFp8();
  if (Want(filter, "ops")) BenchOps();
  if (Want(filter, "moe")) BenchMoe();
  return 0;
}
