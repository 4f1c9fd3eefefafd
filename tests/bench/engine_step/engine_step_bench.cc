// Times one Loom CPU training step (ZeroGradients + ForwardBackward + AdamW on
// every parameter) on a ~10M-parameter Llama, and the machine's sgemm rate on
// a large square-ish GEMM, so a step can be reported as a fraction of it.
// Prints one JSON line; run.sh puts it next to the PyTorch number.
//
// usage: engine_step_bench [--threads=N] [--steps=N] [--batch=8] [--seq=256]
//                          [--recompute=none|selective|full]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/cpu_ops.h"
#include "worker/engine/model/llama_model.h"

namespace {

using Clock = std::chrono::steady_clock;

// CPU time of the whole process (all threads), seconds.
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0)
      return std::atoll(argv[i] + prefix.size());
  return def;
}

std::string StrFlag(int argc, char** argv, const char* name, const char* def) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  return def;
}

// The machine's sgemm rate on `threads` cores: best of a few runs of
// C[m,n] = A[m,k] B[k,n], taking the better of OpenBLAS's own threading and
// the backend's (serial OpenBLAS calls on row blocks, see kernels/cpu/gemm.cc).
double SgemmGflops(loom::kernels::Ops& ops, int threads, int64_t m, int64_t n, int64_t k) {
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n);
  double best = 1e30;
  for (int mode = 0; mode < 2; ++mode) {
    openblas_set_num_threads(mode == 0 ? threads : 1);
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      if (mode == 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k,
                    b.data(), n, 0.0f, c.data(), n);
      } else {
        ops.Gemm(loom::kernels::Transpose::kNo, loom::kernels::Transpose::kNo, m, n, k, 1.0f,
                 a.data(), k, b.data(), n, 0.0f, c.data(), n);
      }
      best = std::min(best, Seconds(t0, Clock::now()));
    }
  }
  openblas_set_num_threads(1);  // as CpuOps leaves it
  return 2.0 * m * n * k / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = static_cast<int>(Flag(argc, argv, "threads", 0));
  const int64_t steps = Flag(argc, argv, "steps", 5);
  const int64_t batch = Flag(argc, argv, "batch", 8);
  const int64_t seq = Flag(argc, argv, "seq", 256);
  const std::string recompute_name = StrFlag(argc, argv, "recompute", "none");
  loom::spec::Recompute recompute = loom::spec::Recompute::kNone;
  if (recompute_name == "selective") recompute = loom::spec::Recompute::kSelective;
  if (recompute_name == "full") recompute = loom::spec::Recompute::kFull;

  loom::spec::ModelSpec c;
  c.vocab_size = Flag(argc, argv, "vocab", 256);
  c.hidden_size = Flag(argc, argv, "hidden", 384);
  c.num_layers = Flag(argc, argv, "layers", 6);
  c.num_heads = Flag(argc, argv, "heads", 6);
  c.num_kv_heads = Flag(argc, argv, "kv_heads", 2);
  c.ffn_hidden_size = Flag(argc, argv, "ffn", 1024);
  c.max_seq_len = seq;
  c.tie_embeddings = false;

  auto ops = std::shared_ptr<loom::kernels::Ops>(loom::kernels::cpu::MakeCpuOps(threads));
  const double sgemm = SgemmGflops(*ops, ops->num_threads(), 2048, 1024, 1024);
  loom::engine::LlamaModel model(c, recompute, ops);
  model.InitParameters(1234);
  const auto params = model.Parameters();
  const auto grads = model.Gradients();
  std::vector<std::vector<float>> m, v;
  for (const auto& p : params) {
    m.emplace_back(p.numel(), 0.0f);
    v.emplace_back(p.numel(), 0.0f);
  }
  std::vector<int32_t> inputs(batch * seq), targets(batch * seq);
  for (int64_t i = 0; i < batch * seq; ++i) {
    inputs[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
    targets[i] = static_cast<int32_t>((i * 104729 + 7) % c.vocab_size);
  }
  auto step = [&](int64_t n) {
    model.ZeroGradients();
    const float loss = model.ForwardBackward(inputs.data(), targets.data(), batch, seq, 1.0f);
    for (size_t i = 0; i < params.size(); ++i) {
      const float wd = params[i].shape.size() >= 2 ? 0.1f : 0.0f;
      loom::kernels::cpu::AdamWStep(params[i].data, grads[i].data, m[i].data(), v[i].data(),
                                    params[i].numel(), 1e-3f, 0.9f, 0.95f, 1e-8f, wd, n);
    }
    return loss;
  };
  step(1);  // warm-up: allocation, page faults, thread pools
  std::vector<double> times, cpu;
  float loss = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    const double c0 = ProcessCpuSeconds();
    loss = step(s + 2);
    times.push_back(Seconds(t0, Clock::now()));
    cpu.push_back(ProcessCpuSeconds() - c0);
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu.begin(), cpu.end());
  const double median = times[times.size() / 2];

  // Useful FLOPs of a step: 6 per weight per token for the GEMMs (forward 2,
  // backward 4), and for causal attention the visible half of QK^T and PV
  // (forward 2 products, backward 5 with the recomputed scores).
  const int64_t tokens = batch * seq, hd = c.hidden_size / c.num_heads;
  const int64_t q_dim = c.num_heads * hd, kv_dim = c.num_kv_heads * hd;
  const double matmul_weights =
      static_cast<double>(c.num_layers) *
          (c.hidden_size * (q_dim + 2 * kv_dim) + q_dim * c.hidden_size +
           3.0 * c.hidden_size * c.ffn_hidden_size) +
      static_cast<double>(c.vocab_size) * c.hidden_size;
  const double attn_pair = 2.0 * batch * c.num_heads * (seq * (seq + 1) / 2.0) * hd;
  const double flops = 6.0 * matmul_weights * tokens + c.num_layers * attn_pair * (2 + 5);
  std::printf(
      "{\"impl\":\"loom\",\"threads\":%d,\"params\":%lld,\"batch\":%lld,\"seq\":%lld,"
      "\"recompute\":\"%s\",\"step_ms\":%.2f,\"min_ms\":%.2f,\"cpu_ms\":%.2f,\"loss\":%.6f,"
      "\"step_gflops\":%.1f,\"sgemm_gflops\":%.1f,\"fraction_of_sgemm\":%.3f}\n",
      ops->num_threads(), static_cast<long long>(model.NumParameters()),
      static_cast<long long>(batch), static_cast<long long>(seq), recompute_name.c_str(),
      median * 1e3, times.front() * 1e3, cpu[cpu.size() / 2] * 1e3, loss, flops / median / 1e9, sgemm,
      flops / median / 1e9 / sgemm);
  return 0;
}
