// What tensor parallelism sends, from the Gloo communicator's counters after
// one ForwardBackward, against the analytic volumes (docs/tensor_parallel.md):
//  - TP: per layer four all-reduces of the [B*S, H] activations (two in
//    forward, two in backward), i.e. 4*B*S*H floats of logical_bytes per layer,
//    plus one for the embedding and one for the LM head's input gradient;
//  - SP: the same buffers as reduce-scatters plus all-gathers, which send
//    exactly the bytes the all-reduces send;
//  - the cross-entropy exchanges 2 floats per token (never the logits), and
//    replicated tensors' gradients (SP norms, replicated kv heads) are summed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/model_tp/tp_test_util.h"
#include "worker/comm/in_process_store.h"
#include "worker/comm/traffic.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine {
namespace {

namespace traffic = comm::traffic;

constexpr int64_t kBatch = 2, kSeq = 12, kTp = 2;
constexpr int64_t kFloat = 4;

std::vector<comm::CommStats> StatsAfterOneStep(const spec::ModelSpec& c, bool sp) {
  comm::InProcessStore store;
  auto comms = comm::testing::MakeGroup(store, kTp, absl::Seconds(30), "tp");
  std::vector<comm::CommStats> stats(kTp);
  comm::testing::RunRanks(comms, [&](int rank, comm::Communicator& group) {
    LlamaModel model(c, spec::Recompute::kNone, kernels::cpu::MakeCpuOps(1), {&group, sp});
    model.InitParameters(5);
    const testing::TokenBatch b = testing::RandomTokens(kBatch, kSeq, 37, 9);
    model.ForwardBackward(b.inputs.data(), b.targets.data(), kBatch, kSeq, 1.0f);
    EXPECT_TRUE(model.status().ok()) << model.status();
    stats[rank] = group.Stats();
  });
  return stats;
}

comm::OpCounters Get(const comm::CommStats& s, const std::string& op) {
  auto it = s.find(op);
  return it == s.end() ? comm::OpCounters{} : it->second;
}

TEST(TpTrafficTest, TensorParallelAllReducesFourActivationsPerLayer) {
  const spec::ModelSpec c = testing::TinyModel(4, 2, false);  // kv heads split: nothing replicated
  const int64_t L = c.num_layers, T = kBatch * kSeq, H = c.hidden_size;
  const int64_t activation = T * H * kFloat;  // one [B*S, H] buffer
  for (const comm::CommStats& s : StatsAfterOneStep(c, false)) {
    const comm::OpCounters ar = Get(s, "all_reduce");
    EXPECT_EQ(ar.calls, 4 * L + 2);
    // The "TP 4*B*S*H per layer" in logical (full-buffer) terms, in
    // bytes: the layers' share once the embedding's and LM head's are removed.
    EXPECT_EQ((ar.logical_bytes - 2 * activation) / L, 4 * kBatch * kSeq * H * kFloat);
    EXPECT_EQ(ar.logical_bytes % L, 0);
    EXPECT_EQ(ar.bytes, (4 * L + 2) * traffic::AllReduceBytes(activation, kTp));
    // The loss: [lse, target logit] per token, gathered; no logits move.
    const comm::OpCounters ag = Get(s, "all_gather");
    EXPECT_EQ(ag.calls, 1);
    EXPECT_EQ(ag.logical_bytes, kTp * 2 * T * kFloat);
    EXPECT_EQ(ag.bytes, traffic::AllGatherBytes(2 * T * kFloat, kTp));
    EXPECT_EQ(Get(s, "reduce_scatter").calls, 0);
  }
}

TEST(TpTrafficTest, SequenceParallelSendsWhatTheAllReducesWould) {
  const spec::ModelSpec c = testing::TinyModel(4, 2, false);
  const int64_t L = c.num_layers, T = kBatch * kSeq, H = c.hidden_size;
  const int64_t activation = T * H * kFloat;
  const std::vector<comm::CommStats> tp = StatsAfterOneStep(c, false);
  const std::vector<comm::CommStats> sp = StatsAfterOneStep(c, true);
  const int64_t loss_gather = traffic::AllGatherBytes(2 * T * kFloat, kTp);
  for (int r = 0; r < kTp; ++r) {
    const comm::OpCounters rs = Get(sp[r], "reduce_scatter");
    const comm::OpCounters ag = Get(sp[r], "all_gather");
    // Per layer 2 + 2 of each; the embedding and LM head one of each.
    EXPECT_EQ(rs.calls, 4 * L + 2);
    EXPECT_EQ(ag.calls, 4 * L + 2 + 1);  // + the loss statistics
    EXPECT_EQ(rs.logical_bytes, (4 * L + 2) * activation);
    EXPECT_EQ(ag.logical_bytes, (4 * L + 2) * activation + kTp * 2 * T * kFloat);
    EXPECT_EQ(rs.bytes, (4 * L + 2) * traffic::ReduceScatterBytes(activation, kTp));
    // The same total as TP's all-reduces.
    EXPECT_EQ(rs.bytes + ag.bytes - loss_gather, Get(tp[r], "all_reduce").bytes);
    // The norm weights' gradients, partial per sequence shard, are summed:
    // one all-reduce per layer (both norms) and one for the final norm.
    const comm::OpCounters ar = Get(sp[r], "all_reduce");
    EXPECT_EQ(ar.calls, L + 1);
    EXPECT_EQ(ar.logical_bytes, (2 * H * L + H) * kFloat);
  }
}

TEST(TpTrafficTest, ReplicatedKvHeadsSumTheirGradients) {
  const spec::ModelSpec c = testing::TinyModel(4, 1, false);  // one kv head on both ranks
  const int64_t L = c.num_layers, T = kBatch * kSeq, H = c.hidden_size, hd = c.head_dim();
  for (const comm::CommStats& s : StatsAfterOneStep(c, false)) {
    const comm::OpCounters ar = Get(s, "all_reduce");
    EXPECT_EQ(ar.calls, 4 * L + 2 + L);
    EXPECT_EQ(ar.logical_bytes, (4 * L + 2) * T * H * kFloat + L * 2 * hd * H * kFloat);
  }
}

}  // namespace
}  // namespace loom::engine
