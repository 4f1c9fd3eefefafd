// The Llama model under context parallelism (and CP x TP, with and without
// sequence parallelism): each CP rank runs its zigzag chunks of the same
// micro-batches; the loss (every CP rank's) and the gradients summed over the
// CP group equal one process's, for every recompute mode; a local length that
// does not split into two chunks is refused through status().
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/comm/rank_harness.h"
#include "tests/model_tp/tp_test_util.h"
#include "worker/engine/context_parallel/zigzag.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine {
namespace {

using testing::Shard;
using testing::TensorMap;
using testing::TokenBatch;

constexpr uint64_t kSeed = 1234;
constexpr double kTolerance = 1e-5;

std::vector<TokenBatch> MicroBatches(const spec::ModelSpec& c, int64_t seq) {
  return {testing::RandomTokens(2, seq, static_cast<int32_t>(c.vocab_size), 7),
          testing::RandomTokens(2, seq, static_cast<int32_t>(c.vocab_size), 8)};
}

struct Outcome {
  std::vector<float> losses;
  TensorMap grads;
};

// Two accumulated micro-batches (1/2 each) and an evaluation, on `rank`'s
// chunks of the sequences (all of them without CP).
Outcome Run(LlamaModel& model, const std::vector<TokenBatch>& batches, const ZigzagSplit* z,
            int rank) {
  Outcome out;
  model.ZeroGradients();
  auto run = [&](const TokenBatch& b, bool train) {
    std::vector<int32_t> in = b.inputs, tg = b.targets;
    int64_t seq = b.seq;
    if (z != nullptr) {
      in = LocalTokens(*z, rank, b.inputs.data(), b.batch);
      tg = LocalTokens(*z, rank, b.targets.data(), b.batch);
      seq = z->local_seq();
    }
    return train ? model.ForwardBackward(in.data(), tg.data(), b.batch, seq,
                                         1.0f / static_cast<float>(batches.size()))
                 : model.ForwardLoss(in.data(), tg.data(), b.batch, seq);
  };
  for (const TokenBatch& b : batches) out.losses.push_back(run(b, true));
  out.losses.push_back(run(batches[0], false));
  return out;
}

void ExpectCpEqualsOneProcess(int cp, int tp, bool sp, spec::Recompute mode, int64_t kv_heads) {
  const spec::ModelSpec c = testing::TinyModel(4, kv_heads, false);
  const int64_t seq = 8 * cp;
  const std::vector<TokenBatch> batches = MicroBatches(c, seq);
  Outcome one;
  {
    LlamaModel model(c, mode, kernels::cpu::MakeCpuOps(1));
    model.InitParameters(kSeed);
    one = Run(model, batches, nullptr, 0);
    one.grads = testing::ToMap(model.Gradients());
  }
  auto z = ZigzagSplit::Make(seq, cp);
  ASSERT_TRUE(z.ok());
  // Ranks (k, t): CP group per t, TP group per k.
  comm::InProcessStore store;
  std::vector<std::vector<std::unique_ptr<comm::Communicator>>> cp_groups(tp), tp_groups(cp);
  for (int t = 0; t < tp; ++t) cp_groups[t] = comm::testing::MakeGroup(store, cp, absl::Seconds(60), "cp");
  for (int k = 0; k < cp && tp > 1; ++k)
    tp_groups[k] = comm::testing::MakeGroup(store, tp, absl::Seconds(60), "tp");
  std::vector<std::vector<float>> losses(cp * tp);
  std::vector<std::vector<Shard>> grads(cp * tp);
  std::vector<std::thread> threads;
  for (int k = 0; k < cp; ++k)
    for (int t = 0; t < tp; ++t)
      threads.emplace_back([&, k, t] {
        TensorParallelOptions parallel;
        parallel.tp = tp > 1 ? tp_groups[k][t].get() : nullptr;
        parallel.sequence_parallel = sp;
        parallel.cp = cp_groups[t][k].get();
        LlamaModel model(c, mode, kernels::cpu::MakeCpuOps(1), parallel);
        model.InitParameters(kSeed);
        losses[k * tp + t] = Run(model, batches, &*z, k).losses;
        EXPECT_TRUE(model.status().ok()) << model.status();
        grads[k * tp + t] = testing::Snapshot(model.Gradients());
      });
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < one.losses.size(); ++i)
    for (int r = 0; r < cp * tp; ++r)
      EXPECT_NEAR(losses[r][i], one.losses[i], kTolerance * std::abs(one.losses[i]))
          << "loss " << i << " rank " << r;
  // The CP ranks' shares of each TP shard add up to the shard's gradient.
  std::vector<std::vector<Shard>> summed(tp);
  for (int t = 0; t < tp; ++t) {
    summed[t] = grads[t];
    for (int k = 1; k < cp; ++k)
      for (size_t v = 0; v < summed[t].size(); ++v)
        for (size_t i = 0; i < summed[t][v].values.size(); ++i)
          summed[t][v].values[i] += grads[k * tp + t][v].values[i];
  }
  testing::ExpectMapsNear(testing::Assemble(summed), one.grads, kTolerance, "gradients");
}

using spec::Recompute;
TEST(CpModel, Cp2EqualsOneProcess) { ExpectCpEqualsOneProcess(2, 1, false, Recompute::kNone, 2); }
TEST(CpModel, Cp4EqualsOneProcess) { ExpectCpEqualsOneProcess(4, 1, false, Recompute::kNone, 1); }
TEST(CpModel, Cp2SelectiveRecompute) {
  ExpectCpEqualsOneProcess(2, 1, false, Recompute::kSelective, 2);
}
TEST(CpModel, Cp2FullRecompute) { ExpectCpEqualsOneProcess(2, 1, false, Recompute::kFull, 2); }
TEST(CpModel, Cp2Tp2) { ExpectCpEqualsOneProcess(2, 2, false, Recompute::kNone, 2); }
TEST(CpModel, Cp2Tp2SequenceParallel) { ExpectCpEqualsOneProcess(2, 2, true, Recompute::kNone, 2); }

TEST(CpModel, RefusesALocalLengthThatIsNotTwoChunks) {
  const spec::ModelSpec c = testing::TinyModel(4, 2, false);
  comm::InProcessStore store;
  auto group = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "cp");
  comm::testing::RunRanks(group, [&](int rank, comm::Communicator& cp) {
    TensorParallelOptions parallel;
    parallel.cp = &cp;
    LlamaModel model(c, Recompute::kNone, kernels::cpu::MakeCpuOps(1), parallel);
    model.InitParameters(kSeed);
    const TokenBatch b = testing::RandomTokens(1, 5, static_cast<int32_t>(c.vocab_size), 3);
    EXPECT_TRUE(std::isnan(model.ForwardBackward(b.inputs.data(), b.targets.data(), 1, 5, 1.0f)));
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(model.status().message().find("seq_len 10"), std::string::npos) << model.status();
  });
}

}  // namespace
}  // namespace loom::engine
