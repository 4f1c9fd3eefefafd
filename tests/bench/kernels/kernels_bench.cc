// Per-kernel development benchmarks of the CPU backend at the shapes of the
// ~10M-parameter benchmark model (batch 8, seq 256, hidden 384, 6/2 heads,
// ffn 1024, vocab 256). Not a test: numbers only.
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/rope_tables.h"

namespace {

using loom::kernels::AttentionDims;
using loom::kernels::Transpose;

constexpr int64_t kBatch = 8, kSeq = 256, kTokens = kBatch * kSeq, kHidden = 384;
constexpr int64_t kHeads = 6, kKvHeads = 2, kHeadDim = 64, kFfn = 1024, kVocab = 256;
constexpr int64_t kQkv = (kHeads + 2 * kKvHeads) * kHeadDim;

loom::kernels::cpu::CpuOps& Ops() {
  static loom::kernels::cpu::CpuOps ops(0);
  return ops;
}

std::vector<float> Filled(int64_t n, float scale = 0.1f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i));
  return v;
}

// Args: m, n, k, trans_a, trans_b (the model's forward, dX and dW shapes).
void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const Transpose ta = state.range(3) ? Transpose::kYes : Transpose::kNo;
  const Transpose tb = state.range(4) ? Transpose::kYes : Transpose::kNo;
  const auto a = Filled(m * k), b = Filled(k * n);
  std::vector<float> c(m * n);
  for (auto _ : state)
    Ops().Gemm(ta, tb, m, n, k, 1.0f, a.data(), ta == Transpose::kNo ? k : m, b.data(),
               tb == Transpose::kNo ? n : k, 0.0f, c.data(), n);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Gemm)
    ->Args({kTokens, kQkv, kHidden, 0, 1})
    ->Args({kTokens, 2 * kFfn, kHidden, 0, 1})
    ->Args({kTokens, kHidden, kFfn, 0, 0})
    ->Args({2 * kFfn, kHidden, kTokens, 1, 0})
    ->Args({kHidden, kFfn, kTokens, 1, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

AttentionDims Dims() {
  AttentionDims d;
  d.batch = kBatch;
  d.seq_q = d.seq_kv = kSeq;
  d.num_heads = kHeads;
  d.num_kv_heads = kKvHeads;
  d.head_dim = kHeadDim;
  d.causal = true;
  d.scale = 0.125f;
  d.q_row_stride = d.k_row_stride = d.v_row_stride = kQkv;
  d.o_row_stride = kHeads * kHeadDim;
  return d;
}

// Causal FLOPs: the visible half of the two (forward) or five (backward) products.
double AttentionFlops(int products) {
  return products * 2.0 * kBatch * kHeads * (kSeq * (kSeq + 1) / 2.0) * kHeadDim;
}

void BM_AttentionForward(benchmark::State& state) {
  const AttentionDims d = Dims();
  const auto qkv = Filled(kTokens * kQkv, 1.0f);
  std::vector<float> out(kTokens * kHeads * kHeadDim), lse(kBatch * kHeads * kSeq);
  const int64_t q = 0, k = kHeads * kHeadDim, v = k + kKvHeads * kHeadDim;
  for (auto _ : state)
    Ops().AttentionForward(d, qkv.data() + q, qkv.data() + k, qkv.data() + v, out.data(),
                           lse.data());
  state.counters["GFLOP/s"] = benchmark::Counter(
      AttentionFlops(2), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionForward)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AttentionBackward(benchmark::State& state) {
  const AttentionDims d = Dims();
  const auto qkv = Filled(kTokens * kQkv, 1.0f);
  const auto d_out = Filled(kTokens * kHeads * kHeadDim);
  std::vector<float> out(kTokens * kHeads * kHeadDim), lse(kBatch * kHeads * kSeq),
      dqkv(kTokens * kQkv);
  const int64_t q = 0, k = kHeads * kHeadDim, v = k + kKvHeads * kHeadDim;
  Ops().AttentionForward(d, qkv.data() + q, qkv.data() + k, qkv.data() + v, out.data(),
                         lse.data());
  for (auto _ : state)
    Ops().AttentionBackward(d, qkv.data() + q, qkv.data() + k, qkv.data() + v, out.data(),
                            lse.data(), d_out.data(), dqkv.data() + q, dqkv.data() + k,
                            dqkv.data() + v);
  state.counters["GFLOP/s"] = benchmark::Counter(
      AttentionFlops(5), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RmsNormForwardBackward(benchmark::State& state) {
  const auto x = Filled(kTokens * kHidden, 1.0f), w = Filled(kHidden, 1.0f),
             dy = Filled(kTokens * kHidden);
  std::vector<float> y(kTokens * kHidden), rstd(kTokens), dx(kTokens * kHidden), dw(kHidden);
  for (auto _ : state) {
    Ops().RmsNormForward(x.data(), w.data(), kTokens, kHidden, 1e-5f, y.data(), rstd.data());
    Ops().RmsNormBackward(dy.data(), x.data(), w.data(), rstd.data(), kTokens, kHidden, dx.data(),
                          true, dw.data());
  }
}
BENCHMARK(BM_RmsNormForwardBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_SwiGluForwardBackward(benchmark::State& state) {
  const auto gu = Filled(kTokens * 2 * kFfn, 3.0f), d_out = Filled(kTokens * kFfn);
  std::vector<float> out(kTokens * kFfn), dgu(kTokens * 2 * kFfn);
  for (auto _ : state) {
    Ops().SwiGluForward(kTokens, kFfn, gu.data(), gu.data() + kFfn, 2 * kFfn, out.data(), kFfn);
    Ops().SwiGluBackward(kTokens, kFfn, gu.data(), gu.data() + kFfn, 2 * kFfn, d_out.data(), kFfn,
                         dgu.data(), dgu.data() + kFfn);
  }
}
BENCHMARK(BM_SwiGluForwardBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_RopeForward(benchmark::State& state) {
  auto qkv = Filled(kTokens * kQkv, 1.0f);
  const auto t = loom::kernels::MakeRopeTables(kSeq, kHeadDim, 10000.0);
  for (auto _ : state)
    Ops().RopeForward(qkv.data(), kBatch, kSeq, kHeads + kKvHeads, kHeadDim, kQkv, t.cos.data(),
                      t.sin.data(), 0);
}
BENCHMARK(BM_RopeForward)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_CrossEntropyForwardBackward(benchmark::State& state) {
  const auto logits = Filled(kTokens * kVocab, 3.0f);
  std::vector<int32_t> targets(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) targets[i] = static_cast<int32_t>(i % kVocab);
  std::vector<float> work(logits.size()), loss(kTokens);
  for (auto _ : state) {
    state.PauseTiming();
    work = logits;
    state.ResumeTiming();
    Ops().CrossEntropyForwardBackward(work.data(), targets.data(), kTokens, kVocab,
                                      1.0f / kTokens, loss.data());
  }
}
BENCHMARK(BM_CrossEntropyForwardBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_EmbeddingBackward(benchmark::State& state) {
  const auto d_out = Filled(kTokens * kHidden);
  std::vector<int32_t> ids(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) ids[i] = static_cast<int32_t>((i * 31) % kVocab);
  std::vector<float> table(kVocab * kHidden);
  for (auto _ : state)
    Ops().EmbeddingBackward(ids.data(), kTokens, d_out.data(), kVocab, kHidden, table.data());
}
BENCHMARK(BM_EmbeddingBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_AdamW(benchmark::State& state) {
  const int64_t n = 10'000'000;
  auto p = Filled(n), g = Filled(n);
  std::vector<float> m(n), v(n);
  int64_t step = 0;
  for (auto _ : state)
    Ops().AdamW(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step);
}
BENCHMARK(BM_AdamW)->Unit(benchmark::kMillisecond)->UseRealTime();

// The MoE layer's routing and row movement at the benchmark model's tokens,
// 8 experts, top 2 (the shape of docs/moe.md's MoE-vs-dense measurement).
struct MoeRouted {
  loom::kernels::MoeRouteDims d;
  std::vector<float> logits, weight, scores, probs;
  std::vector<int32_t> expert, row_of, assignment_of;
  std::vector<int64_t> counts;
  std::vector<double> prob_sum;
  MoeRouted() {
    d.tokens = kTokens;
    d.num_experts = 8;
    d.top_k = 2;
    d.aux_loss_coef = 0.01;
    logits = Filled(kTokens * d.num_experts, 3.0f);
    weight.resize(kTokens * d.top_k);
    scores.resize(logits.size());
    probs.resize(logits.size());
    expert.resize(weight.size());
    row_of.resize(weight.size());
    assignment_of.resize(weight.size());
    counts.resize(2 * d.num_experts);
    prob_sum.resize(d.num_experts);
    Route();
  }
  void Route() {
    Ops().MoeRoute(d, logits.data(), nullptr, expert.data(), weight.data(), scores.data(),
                   probs.data(), row_of.data(), assignment_of.data(), counts.data(), prob_sum.data());
  }
};

void BM_MoeRoute(benchmark::State& state) {
  MoeRouted r;
  for (auto _ : state) r.Route();
}
BENCHMARK(BM_MoeRoute)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_MoePermuteUnpermute(benchmark::State& state) {
  MoeRouted r;
  const auto x = Filled(kTokens * kHidden);
  std::vector<float> rows(kTokens * r.d.top_k * kHidden), y(kTokens * kHidden);
  for (auto _ : state) {
    Ops().MoePermute(kTokens * r.d.top_k, r.d.top_k, kHidden, x.data(), r.assignment_of.data(),
                     nullptr, rows.data());
    Ops().MoeUnpermute(kTokens, r.d.top_k, kHidden, rows.data(), r.row_of.data(), r.weight.data(),
                       y.data());
  }
}
BENCHMARK(BM_MoePermuteUnpermute)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_MoeGateGradRouterBackward(benchmark::State& state) {
  MoeRouted r;
  const auto dy = Filled(kTokens * kHidden), rows = Filled(kTokens * r.d.top_k * kHidden);
  std::vector<float> d_weight(kTokens * r.d.top_k), d_logits(r.logits.size());
  for (auto _ : state) {
    Ops().MoeGateGrad(kTokens, r.d.top_k, kHidden, dy.data(), rows.data(), r.row_of.data(),
                      d_weight.data());
    Ops().MoeRouterBackward(r.d, r.expert.data(), r.weight.data(), r.scores.data(), r.probs.data(),
                            r.counts.data(), d_weight.data(), 1.0, d_logits.data());
  }
}
BENCHMARK(BM_MoeGateGradRouterBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
