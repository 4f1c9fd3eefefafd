// The tensor-parallel Llama model against one process: ranks are threads,
// each with a real Gloo communicator over loopback. Every rank trains the same
// micro-batches; the loss and every parameter's gradient (assembled from the
// shards) must equal the single-process model's within 1e-5 relative, for TP
// with and without sequence parallelism, kv heads split and replicated, tied
// and untied embeddings and every recompute mode. Also: the shards of the
// initial weights assemble to exactly the single-process weights, the plan's
// refusals, and what a failed collective does.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/model_tp/tp_test_util.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/tensor_parallel/tp_plan.h"

namespace loom::engine {
namespace {

using testing::Assemble;
using testing::ExpectMapsNear;
using testing::Shard;
using testing::Snapshot;
using testing::TensorMap;
using testing::TokenBatch;

constexpr double kTolerance = 1e-5;
constexpr uint64_t kSeed = 1234;

struct Outcome {
  std::vector<float> losses;  // per micro-batch, then the evaluation loss
  TensorMap params, grads;
};

std::vector<TokenBatch> MicroBatches(const spec::ModelSpec& c) {
  return {testing::RandomTokens(2, 12, static_cast<int32_t>(c.vocab_size), 7),
          testing::RandomTokens(2, 12, static_cast<int32_t>(c.vocab_size), 8)};
}

// Two accumulated micro-batches (loss_scale 1/2 each), then an evaluation.
template <typename Model>
std::vector<float> RunMicroBatches(Model& model, const std::vector<TokenBatch>& batches) {
  std::vector<float> losses;
  model.ZeroGradients();
  for (const TokenBatch& b : batches) {
    losses.push_back(model.ForwardBackward(b.inputs.data(), b.targets.data(), b.batch, b.seq,
                                           1.0f / static_cast<float>(batches.size())));
  }
  const TokenBatch& e = batches[0];
  losses.push_back(model.ForwardLoss(e.inputs.data(), e.targets.data(), e.batch, e.seq));
  return losses;
}

Outcome RunSingle(const spec::ModelSpec& c, spec::Recompute mode) {
  LlamaModel model(c, mode, kernels::cpu::MakeCpuOps(1));
  model.InitParameters(kSeed);
  Outcome out;
  out.params = testing::ToMap(model.Parameters());
  out.losses = RunMicroBatches(model, MicroBatches(c));
  out.grads = testing::ToMap(model.Gradients());
  return out;
}

Outcome RunTensorParallel(const spec::ModelSpec& c, spec::Recompute mode, int tp, bool sp) {
  comm::InProcessStore store;
  auto comms = comm::testing::MakeGroup(store, tp, absl::Seconds(30), "tp");
  std::vector<std::vector<Shard>> params(tp), grads(tp);
  std::vector<std::vector<float>> losses(tp);
  comm::testing::RunRanks(comms, [&](int rank, comm::Communicator& group) {
    LlamaModel model(c, mode, kernels::cpu::MakeCpuOps(1), {&group, sp});
    model.InitParameters(kSeed);
    params[rank] = Snapshot(model.Parameters());
    losses[rank] = RunMicroBatches(model, MicroBatches(c));
    EXPECT_TRUE(model.status().ok()) << model.status();
    grads[rank] = Snapshot(model.Gradients());
  });
  for (int r = 1; r < tp; ++r) EXPECT_EQ(losses[r], losses[0]) << "rank " << r;
  Outcome out;
  out.losses = losses[0];
  out.params = Assemble(params);
  out.grads = Assemble(grads);
  return out;
}

void ExpectSameAsOneProcess(const spec::ModelSpec& c, spec::Recompute mode, int tp, bool sp) {
  const Outcome one = RunSingle(c, mode);
  const Outcome many = RunTensorParallel(c, mode, tp, sp);
  ASSERT_EQ(many.losses.size(), one.losses.size());
  for (size_t i = 0; i < one.losses.size(); ++i) {
    EXPECT_NEAR(many.losses[i], one.losses[i], kTolerance * std::abs(one.losses[i])) << "loss " << i;
  }
  // The shards of the initial weights are slices of the same draws.
  ASSERT_EQ(many.params.size(), one.params.size());
  for (const auto& [name, w] : one.params) EXPECT_EQ(many.params.at(name), w) << name;
  ExpectMapsNear(many.grads, one.grads, kTolerance, "gradients");
}

struct TpCase {
  std::string name;
  int64_t heads, kv_heads;
  bool tied;
  int tp;
  bool sp;
  spec::Recompute mode;
};

void PrintTo(const TpCase& c, std::ostream* os) { *os << c.name; }

class TpEquivalenceTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(TpEquivalenceTest, LossAndGradientsEqualOneProcess) {
  const TpCase& p = GetParam();
  ExpectSameAsOneProcess(testing::TinyModel(p.heads, p.kv_heads, p.tied), p.mode, p.tp, p.sp);
}

using spec::Recompute;
INSTANTIATE_TEST_SUITE_P(
    Layouts, TpEquivalenceTest,
    ::testing::Values(
        // 4 heads / 2 kv heads: kv heads split over 2 ranks.
        TpCase{"tp2_kv_split", 4, 2, false, 2, false, Recompute::kNone},
        TpCase{"tp2_sp_kv_split", 4, 2, false, 2, true, Recompute::kNone},
        // 4 heads / 1 kv head: the kv head replicated on both ranks.
        TpCase{"tp2_kv_replicated", 4, 1, false, 2, false, Recompute::kNone},
        TpCase{"tp2_sp_kv_replicated", 4, 1, false, 2, true, Recompute::kNone},
        TpCase{"tp2_sp_tied", 4, 2, true, 2, true, Recompute::kNone},
        TpCase{"tp2_tied_selective", 4, 1, true, 2, false, Recompute::kSelective},
        TpCase{"tp2_sp_full_recompute", 4, 1, false, 2, true, Recompute::kFull},
        // 4 ranks: 2 kv heads each held by a pair of ranks; vocab 37 = 9+9+9+10.
        TpCase{"tp4_sp_kv_pairs", 4, 2, false, 4, true, Recompute::kNone},
        TpCase{"tp4_kv_pairs_full", 4, 2, true, 4, false, Recompute::kFull}),
    [](const ::testing::TestParamInfo<TpCase>& info) { return info.param.name; });

TEST(TpModelTest, OneRankGroupIsTheSingleProcessModel) {
  // A group of one (and nullptr) is today's model, bit for bit.
  const spec::ModelSpec c = testing::TinyModel(4, 2, false);
  comm::InProcessStore store;
  auto comms = comm::testing::MakeGroup(store, 1, absl::Seconds(10), "tp");
  LlamaModel plain(c, Recompute::kNone, kernels::cpu::MakeCpuOps(1));
  LlamaModel grouped(c, Recompute::kNone, kernels::cpu::MakeCpuOps(1), {comms[0].get(), true});
  plain.InitParameters(kSeed);
  grouped.InitParameters(kSeed);
  const TokenBatch b = testing::RandomTokens(2, 12, 37, 3);
  const float a = plain.ForwardBackward(b.inputs.data(), b.targets.data(), 2, 12, 1.0f);
  const float g = grouped.ForwardBackward(b.inputs.data(), b.targets.data(), 2, 12, 1.0f);
  EXPECT_EQ(a, g);
  EXPECT_EQ(testing::ToMap(plain.Gradients()), testing::ToMap(grouped.Gradients()));
  for (const TensorView& v : grouped.Parameters()) {
    EXPECT_FALSE(v.sharded()) << v.name;
    EXPECT_TRUE(v.global_shape.empty()) << v.name;
    EXPECT_EQ(v.replicas, 1) << v.name;
  }
  EXPECT_EQ(grouped.NumParameters(), grouped.NumGlobalParameters());
}

TEST(TpModelTest, ShardViewsDescribeTheirSlices) {
  const spec::ModelSpec c = testing::TinyModel(4, 1, false);
  comm::InProcessStore store;
  auto comms = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "tp");
  std::vector<std::vector<TensorView>> views(2);
  std::vector<int64_t> local(2), global(2);
  comm::testing::RunRanks(comms, [&](int rank, comm::Communicator& group) {
    LlamaModel model(c, Recompute::kNone, kernels::cpu::MakeCpuOps(1), {&group, false});
    views[rank] = model.Parameters();
    local[rank] = model.NumParameters();
    global[rank] = model.NumGlobalParameters();
  });
  LlamaModel single(c, Recompute::kNone, kernels::cpu::MakeCpuOps(1));
  EXPECT_EQ(global[0], single.NumParameters());
  EXPECT_LT(local[0], global[0]);
  auto find = [&](int rank, const std::string& name) {
    for (const TensorView& v : views[rank])
      if (v.name == name) return v;
    ADD_FAILURE() << name;
    return TensorView{};
  };
  // hidden 32, 4 heads of 8, 1 kv head, ffn 48, vocab 37 over 2 = 18 + 19.
  const TensorView q1 = find(1, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q1.shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(q1.global_shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(q1.shard_axis, 0);
  EXPECT_EQ(q1.shard_offset, 16);
  const TensorView k1 = find(1, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k1.shape, (std::vector<int64_t>{8, 32}));
  EXPECT_FALSE(k1.sharded());
  EXPECT_EQ(k1.replicas, 2);
  const TensorView o1 = find(1, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(o1.shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(o1.shard_axis, 1);
  EXPECT_EQ(o1.shard_offset, 16);
  const TensorView down0 = find(0, "model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(down0.shape, (std::vector<int64_t>{32, 24}));
  EXPECT_EQ(down0.shard_axis, 1);
  EXPECT_EQ(down0.shard_offset, 0);
  const TensorView up1 = find(1, "model.layers.1.mlp.up_proj.weight");
  EXPECT_EQ(up1.shape, (std::vector<int64_t>{24, 32}));
  EXPECT_EQ(up1.shard_offset, 24);
  const TensorView embed1 = find(1, "model.embed_tokens.weight");
  EXPECT_EQ(embed1.shape, (std::vector<int64_t>{19, 32}));
  EXPECT_EQ(embed1.shard_offset, 18);
  EXPECT_EQ(find(0, "lm_head.weight").shape, (std::vector<int64_t>{18, 32}));
  const TensorView norm = find(0, "model.norm.weight");
  EXPECT_FALSE(norm.sharded());
  EXPECT_EQ(norm.replicas, 2);
  EXPECT_EQ(norm.global_shape, (std::vector<int64_t>{32}));
}

TEST(TpPlanTest, RefusesLayoutsItCannotCut) {
  spec::ModelSpec c = testing::TinyModel(4, 2, false);
  EXPECT_TRUE(CheckTensorParallel(c, 1).ok());
  EXPECT_TRUE(CheckTensorParallel(c, 2).ok());
  EXPECT_TRUE(CheckTensorParallel(c, 4).ok());  // kv heads replicated in pairs
  absl::Status s = CheckTensorParallel(c, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.num_heads=4"), absl::string_view::npos) << s;
  c.num_heads = 6;
  c.num_kv_heads = 3;
  c.hidden_size = 36;
  s = CheckTensorParallel(c, 2);
  EXPECT_NE(s.message().find("model.num_kv_heads=3"), absl::string_view::npos) << s;
  c = testing::TinyModel(4, 2, false);
  c.ffn_hidden_size = 50;
  s = CheckTensorParallel(c, 4);
  EXPECT_NE(s.message().find("model.ffn_hidden_size=50"), absl::string_view::npos) << s;
  c = testing::TinyModel(4, 4, false);
  c.vocab_size = 2;
  s = CheckTensorParallel(c, 4);
  EXPECT_NE(s.message().find("model.vocab_size=2"), absl::string_view::npos) << s;
}

TEST(TpPlanTest, KvHeadsSplitOrShared) {
  const spec::ModelSpec c = testing::TinyModel(8, 2, false);
  // tp 2: one kv head each.
  TpPlan p = MakeTpPlan(c, 1, 2, false);
  EXPECT_EQ(p.heads, 4);
  EXPECT_EQ(p.head_first, 4);
  EXPECT_EQ(p.kv_heads, 1);
  EXPECT_EQ(p.kv_head_first, 1);
  EXPECT_EQ(p.kv_replicas, 1);
  // tp 4: heads 4..5 read kv head 1, which ranks 2 and 3 both hold.
  p = MakeTpPlan(c, 2, 4, true);
  EXPECT_EQ(p.heads, 2);
  EXPECT_EQ(p.kv_heads, 1);
  EXPECT_EQ(p.kv_head_first, 1);
  EXPECT_EQ(p.kv_replicas, 2);
  EXPECT_TRUE(p.sequence_parallel);
  EXPECT_EQ(MakeTpPlan(c, 1, 4, false).kv_head_first, 0);
  // Vocabulary rows: uneven but covering.
  int64_t next = 0;
  for (int r = 0; r < 4; ++r) {
    const TpPlan q = MakeTpPlan(c, r, 4, false);
    EXPECT_EQ(q.vocab_first, next);
    next += q.vocab;
  }
  EXPECT_EQ(next, c.vocab_size);
}

// A communicator whose collectives all fail, as a broken group's do.
class BrokenCommunicator : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  absl::Status AllReduce(std::span<float>, comm::ReduceOp) override { return Fail("all_reduce"); }
  std::unique_ptr<comm::Work> AllReduceAsync(std::span<float> d, comm::ReduceOp op) override {
    return std::make_unique<comm::DoneWork>(AllReduce(d, op));
  }
  absl::Status ReduceScatter(std::span<const float>, std::span<float>) override {
    return Fail("reduce_scatter");
  }
  absl::Status AllGather(std::span<const float>, std::span<float>) override {
    return Fail("all_gather");
  }
  absl::Status Broadcast(std::span<float>, int) override { return Fail("broadcast"); }
  absl::Status Send(std::span<const float>, int, uint32_t) override { return Fail("send"); }
  absl::Status Recv(std::span<float>, int, uint32_t) override { return Fail("recv"); }
  absl::Status AllToAll(std::span<const float>, const std::vector<int64_t>&, std::span<float>,
                        const std::vector<int64_t>&) override {
    return Fail("all_to_all");
  }
  absl::Status Barrier() override { return Fail("barrier"); }
  comm::CommStats Stats() const override { return {}; }
  int calls = 0;

 private:
  absl::Status Fail(const std::string& op) {
    ++calls;
    return absl::UnavailableError("group " + name_ + ": " + op + " failed: lost a peer");
  }
  std::string name_ = "tp[0,1]";
};

TEST(TpModelTest, AFailedCollectiveGivesNanAndTheStatus) {
  const spec::ModelSpec c = testing::TinyModel(4, 2, false);
  BrokenCommunicator broken;
  LlamaModel model(c, Recompute::kNone, kernels::cpu::MakeCpuOps(1), {&broken, false});
  model.InitParameters(kSeed);
  const TokenBatch b = testing::RandomTokens(1, 8, 37, 3);
  EXPECT_TRUE(std::isnan(model.ForwardBackward(b.inputs.data(), b.targets.data(), 1, 8, 1.0f)));
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(model.status().message().find("group tp[0,1]: all_reduce"), absl::string_view::npos);
  // Only the first collective ran; the rest were skipped.
  EXPECT_EQ(broken.calls, 1);
  EXPECT_TRUE(std::isnan(model.ForwardLoss(b.inputs.data(), b.targets.data(), 1, 8)));
  EXPECT_FALSE(model.status().ok());
}

TEST(TpModelTest, SequenceParallelNeedsRowsThatDivide) {
  const spec::ModelSpec c = testing::TinyModel(4, 2, false);
  BrokenCommunicator group;  // never reached
  LlamaModel model(c, Recompute::kNone, kernels::cpu::MakeCpuOps(1), {&group, true});
  const TokenBatch b = testing::RandomTokens(1, 7, 37, 3);
  EXPECT_TRUE(std::isnan(model.ForwardBackward(b.inputs.data(), b.targets.data(), 1, 7, 1.0f)));
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("batch * seq = 7"), absl::string_view::npos);
  EXPECT_EQ(group.calls, 0);
}

}  // namespace
}  // namespace loom::engine
