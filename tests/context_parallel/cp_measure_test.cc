// Context parallelism measured (docs/context_parallel.md records the output):
// the per-rank attention FLOPs from the ring's counter under the zigzag split
// (cp4: within 5% of each other; a contiguous split, computed from the same
// block rule, is printed for contrast), and the bytes each rank sends per
// micro-batch from the CP communicator's counters against the planner's CP
// traffic model (planner/time_model.h, CpRingBytesPerLayer).
#include <algorithm>
#include <cstdio>
#include <vector>

#include "planner/constants.h"
#include "planner/memory_model.h"
#include "planner/model_math.h"
#include "planner/time_model.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/model_tp/tp_test_util.h"
#include "worker/engine/context_parallel/zigzag.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine {
namespace {

int64_t Sent(const comm::Communicator& c) {
  const comm::CommStats s = c.Stats();
  auto it = s.find("send");
  return it == s.end() ? 0 : it->second.bytes;
}

struct Measured {
  std::vector<int64_t> flops, bytes;
  int64_t predicted_bytes = 0;
};

Measured Measure(int cp, int64_t batch, int64_t seq) {
  spec::ModelSpec c = testing::TinyModel(4, 2, false);
  c.max_seq_len = seq;
  auto z = ZigzagSplit::Make(seq, cp);
  EXPECT_TRUE(z.ok());
  const testing::TokenBatch b = testing::RandomTokens(batch, seq, static_cast<int32_t>(c.vocab_size), 5);
  comm::InProcessStore store;
  auto group = comm::testing::MakeGroup(store, cp, absl::Seconds(120), "cp");
  Measured m;
  m.flops.resize(cp);
  m.bytes.resize(cp);
  comm::testing::RunRanks(group, [&](int r, comm::Communicator& g) {
    TensorParallelOptions parallel;
    parallel.cp = &g;
    LlamaModel model(c, spec::Recompute::kNone, kernels::cpu::MakeCpuOps(1), parallel);
    model.InitParameters(3);
    const std::vector<int32_t> in = LocalTokens(*z, r, b.inputs.data(), batch);
    const std::vector<int32_t> tg = LocalTokens(*z, r, b.targets.data(), batch);
    model.ForwardBackward(in.data(), tg.data(), batch, z->local_seq(), 1.0f);
    EXPECT_TRUE(model.status().ok()) << model.status();
    m.flops[r] = model.ContextParallelAttentionFlops();
    m.bytes[r] = Sent(g);
  });
  // K and V of the whole sequence, fp32, per layer.
  const double kv_bytes = static_cast<double>(batch * seq * 2 * c.num_kv_heads * c.head_dim() * 4);
  const planner::CpRingBytes ring = planner::CpRingBytesPerLayer(kv_bytes, cp);
  m.predicted_bytes = static_cast<int64_t>(c.num_layers * (ring.forward + ring.backward));
  return m;
}

// The causal pairs rank r would attend to if it held the contiguous r-th
// 1/cp of the sequence (two adjacent chunks), for contrast.
int64_t ContiguousPairs(const ZigzagSplit& z, int r) {
  int64_t pairs = 0;
  for (int64_t q = 2 * r; q < 2 * r + 2; ++q)
    for (int64_t k = 0; k < 2 * z.cp; ++k) pairs += VisiblePairs(true, q, k, z.chunk);
  return pairs;
}

TEST(CpMeasure, Cp4ZigzagFlopsBalancedAndBytesAsPlanned) {
  const int cp = 4;
  const int64_t batch = 1, seq = 512;
  const Measured m = Measure(cp, batch, seq);
  const auto [lo, hi] = std::minmax_element(m.flops.begin(), m.flops.end());
  std::printf("cp%d seq_len %lld: attention FLOPs per rank (counter):", cp,
              static_cast<long long>(seq));
  for (int64_t f : m.flops) std::printf(" %lld", static_cast<long long>(f));
  std::printf("  spread %.4f%%\n", 100.0 * static_cast<double>(*hi - *lo) / static_cast<double>(*hi));
  auto z = ZigzagSplit::Make(seq, cp);
  std::printf("  a contiguous split would give causal pairs per rank:");
  for (int r = 0; r < cp; ++r) std::printf(" %lld", static_cast<long long>(ContiguousPairs(*z, r)));
  std::printf("\n  bytes sent per rank per micro-batch (counter):");
  for (int64_t b : m.bytes) std::printf(" %lld", static_cast<long long>(b));
  std::printf("  planner: %lld\n", static_cast<long long>(m.predicted_bytes));
  EXPECT_GT(*lo, 0);
  EXPECT_LE(static_cast<double>(*hi - *lo), 0.05 * static_cast<double>(*hi));
  for (int64_t b : m.bytes) EXPECT_EQ(b, m.predicted_bytes);
}

TEST(CpMeasure, Cp2BytesAsPlanned) {
  const Measured m = Measure(2, 2, 64);
  for (int64_t b : m.bytes) EXPECT_EQ(b, m.predicted_bytes);
  EXPECT_EQ(m.flops[0], m.flops[1]);
}

// What CP saves in memory: the activations each rank allocates (the model's
// buffers, the ring's included) fall with cp as the planner's memory model
// says (activations and logits divided by cp, plus the ring's buffers): the
// ratio to one process's within 10% for cp2 and cp4.
TEST(CpMeasure, ActivationMemoryFallsAsPlanned) {
  spec::ModelSpec c = testing::TinyModel(4, 2, false);
  c.max_seq_len = 256;
  const int64_t batch = 2, seq = 256;
  const testing::TokenBatch b = testing::RandomTokens(batch, seq, static_cast<int32_t>(c.vocab_size), 9);
  int64_t whole = 0;
  {
    LlamaModel model(c, spec::Recompute::kNone, kernels::cpu::MakeCpuOps(1));
    model.InitParameters(3);
    model.ForwardBackward(b.inputs.data(), b.targets.data(), batch, seq, 1.0f);
    whole = model.ActivationBytes();
  }
  const planner::Workload w = planner::MakeWorkload(planner::ModelShapeFromSpec(c), seq, batch,
                                                    planner::RecipeKind::kFp32);
  auto planned = [&](int cp) {
    planner::Layout l;
    l.cp = cp;
    l.micro_batch_size = batch;
    l.grad_accum = 1;
    const planner::MemoryBreakdown m = planner::EstimateMemory(w, l, planner::CpuEngineConstants());
    return m.activations + m.logits + m.comm_buffers;  // the ring's blocks are buffers
  };
  for (int cp : {2, 4}) {
    auto z = ZigzagSplit::Make(seq, cp);
    ASSERT_TRUE(z.ok());
    comm::InProcessStore store;
    auto group = comm::testing::MakeGroup(store, cp, absl::Seconds(60), "cp");
    std::vector<int64_t> bytes(cp);
    comm::testing::RunRanks(group, [&](int r, comm::Communicator& g) {
      TensorParallelOptions parallel;
      parallel.cp = &g;
      LlamaModel model(c, spec::Recompute::kNone, kernels::cpu::MakeCpuOps(1), parallel);
      model.InitParameters(3);
      const std::vector<int32_t> in = LocalTokens(*z, r, b.inputs.data(), batch);
      const std::vector<int32_t> tg = LocalTokens(*z, r, b.targets.data(), batch);
      model.ForwardBackward(in.data(), tg.data(), batch, z->local_seq(), 1.0f);
      bytes[r] = model.ActivationBytes();
    });
    const double engine_ratio = static_cast<double>(bytes[0]) / static_cast<double>(whole);
    const double planner_ratio = planned(cp) / planned(1);
    std::printf("cp%d: activation bytes per rank %lld (one process %lld): ratio %.3f, planner %.3f\n",
                cp, static_cast<long long>(bytes[0]), static_cast<long long>(whole), engine_ratio,
                planner_ratio);
    for (int r = 1; r < cp; ++r) EXPECT_EQ(bytes[r], bytes[0]);
    EXPECT_NEAR(engine_ratio / planner_ratio, 1.0, 0.10) << "cp" << cp;
  }
}

}  // namespace
}  // namespace loom::engine
