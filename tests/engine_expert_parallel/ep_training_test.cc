// Expert parallelism in the training loop, ranks as threads over real Gloo
// groups of a dp x ep mesh (rank = d * ep + e), against one process: the loss
// of every step, the expert statistics (so the selection bias moves the same),
// the validation loss, and at the end every parameter, each expert compared on
// the rank that holds it and every dense tensor on every rank.
#include <gtest/gtest.h>

#include <array>
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/comm/rank_harness.h"
#include "tests/engine/test_util.h"
#include "worker/comm/in_process_store.h"
#include "worker/engine/expert_parallel/ep_gradients.h"
#include "worker/engine/tensor_parallel/tp_tensors.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {
namespace {

spec::JobSpec MoeJob(const std::string& train, const std::string& val) {
  spec::JobSpec job = testing::TinyJob(train, val);
  job.train.steps = 4;
  job.train.eval_interval = 0;  // the last step evaluates when val is given
  spec::MoeSpec& m = job.model.moe;
  m.num_experts = 4;
  m.top_k = 2;
  m.expert_ffn_hidden_size = 16;
  m.num_shared_experts = 1;
  m.first_dense_layers = 1;
  m.aux_loss_coef = 0.01;
  m.bias_update_rate = 0.01;  // the bias moves from the summed loads
  return job;
}

struct RunResult {
  std::vector<float> losses;
  std::vector<std::vector<double>> loads;  // tokens per expert, per step
  std::optional<double> val_loss;
  std::map<std::string, std::vector<float>> params;  // by name, what this rank holds
};

// Before training (restore) and after it (save); null: nothing.
using Hook = std::function<void(TrainingLoop&)>;

void Train(TrainingLoop& loop, RunResult* out, int64_t until = -1, comm::Communicator* tp = nullptr) {
  while (!loop.done() && (until < 0 || loop.step() < until)) {
    auto p = loop.TrainStep();
    ASSERT_TRUE(p.ok()) << p.status();
    out->losses.push_back(p->loss);
    ASSERT_TRUE(p->moe.has_value());
    out->loads.push_back(p->moe->tokens_per_expert);
    if (p->val_loss) out->val_loss = p->val_loss;
  }
  const std::vector<TensorView> params =
      loop.pipeline_stage() != nullptr ? loop.pipeline_stage()->Parameters() : loop.model().Parameters();
  if (loop.zero_stage() == 3) {  // the model holds shards: gathered over DP, in flat order
    std::vector<float> flat;
    ASSERT_TRUE(loop.GatherParameters(&flat).ok());
    size_t at = 0;
    for (const TensorView& v : params) {
      out->params[v.name].assign(flat.begin() + at, flat.begin() + at + v.numel());
      at += v.numel();
    }
    return;
  }
  for (const TensorView& v : params) {  // whole tensors under TP
    ASSERT_TRUE(GatherGlobal(v, tp, &out->params[v.name]).ok()) << v.name;
  }
}

RunResult Single(const spec::JobSpec& job, const Hook& before = {}) {
  RunResult r;
  auto loop = TrainingLoop::Create(job);
  EXPECT_TRUE(loop.ok()) << loop.status();
  if (!loop.ok()) return r;
  if (before) before(**loop);
  Train(**loop, &r);
  return r;
}

// The pp x dp x ep x tp mesh (tp fastest), each group keyed by the
// coordinates it does not span.
std::vector<RunResult> Mesh(spec::JobSpec job, int dp, int ep, int zero, const Hook& before = {},
                            int64_t until = -1, const Hook& after = {}, int tp = 1, int pp = 1) {
  job.parallelism.dp = dp;
  job.parallelism.ep = ep;
  job.parallelism.tp = tp;
  job.parallelism.pp = pp;
  job.parallelism.zero_stage = zero;
  comm::InProcessStore store;
  using Key = std::array<int, 3>;
  using Group = std::vector<std::unique_ptr<comm::Communicator>>;
  std::map<Key, Group> ep_groups, dp_groups, tp_groups, pp_groups;
  const absl::Duration timeout = absl::Seconds(60);
  for (int a = 0; a < std::max({pp, dp, ep, tp}); ++a) {
    for (int b = 0; b < std::max({pp, dp, ep, tp}); ++b) {
      for (int c = 0; c < std::max({pp, dp, ep, tp}); ++c) {
        if (ep > 1 && a < pp && b < dp && c < tp) ep_groups[{a, b, c}] = comm::testing::MakeGroup(store, ep, timeout, "ep");
        if (dp > 1 && a < pp && b < ep && c < tp) dp_groups[{a, b, c}] = comm::testing::MakeGroup(store, dp, timeout, "dp");
        if (tp > 1 && a < pp && b < dp && c < ep) tp_groups[{a, b, c}] = comm::testing::MakeGroup(store, tp, timeout, "tp");
        if (pp > 1 && a < dp && b < ep && c < tp) pp_groups[{a, b, c}] = comm::testing::MakeGroup(store, pp, timeout, "pp");
      }
    }
  }
  auto member = [](std::map<Key, Group>& groups, Key key, int i) -> comm::Communicator* {
    auto it = groups.find(key);
    return it == groups.end() ? nullptr : it->second[static_cast<size_t>(i)].get();
  };
  std::vector<RunResult> runs(pp * dp * ep * tp);
  std::vector<std::thread> threads;
  for (int p = 0; p < pp; ++p) {
    for (int d = 0; d < dp; ++d) {
      for (int e = 0; e < ep; ++e) {
        for (int t = 0; t < tp; ++t) {
          threads.emplace_back([&, p, d, e, t] {
            comm::Communicator* dpc = member(dp_groups, {p, e, t}, d);
            comm::Communicator* epc = member(ep_groups, {p, d, t}, e);
            comm::Communicator* tpc = member(tp_groups, {p, d, e}, t);
            comm::Communicator* ppc = member(pp_groups, {d, e, t}, p);
            auto ctx = ParallelContext::Make(d, dp, dpc, tpc, ppc, nullptr, nullptr, epc);
            ASSERT_TRUE(ctx.ok()) << ctx.status();
            auto loop = TrainingLoop::Create(job, *ctx);
            ASSERT_TRUE(loop.ok()) << loop.status();
            if (before) before(**loop);
            Train(**loop, &runs[((p * dp + d) * ep + e) * tp + t], until, tpc);
            if (after) after(**loop);
          });
        }
      }
    }
  }
  for (auto& th : threads) th.join();
  return runs;
}

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    norm += double{want[i]} * want[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

void ExpectEqualsOneProcess(const RunResult& want, const std::vector<RunResult>& got, int ep, int tp = 1,
                            int pp = 1) {
  std::map<std::string, int> holders;
  for (size_t r = 0; r < got.size(); ++r) {
    const RunResult& g = got[r];
    ASSERT_EQ(g.losses.size(), want.losses.size()) << "rank " << r;
    for (size_t i = 0; i < want.losses.size(); ++i) {
      EXPECT_NEAR(g.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i])) << "rank " << r << " step " << i + 1;
      ASSERT_EQ(g.loads[i].size(), want.loads[i].size());
      for (size_t e = 0; e < want.loads[i].size(); ++e) EXPECT_EQ(g.loads[i][e], want.loads[i][e]) << "step " << i + 1;
    }
    ASSERT_EQ(g.val_loss.has_value(), want.val_loss.has_value());
    if (want.val_loss) EXPECT_NEAR(*g.val_loss, *want.val_loss, 1e-5 * *want.val_loss) << "rank " << r;
    int experts = 0;
    for (const auto& [name, values] : g.params) {
      auto it = want.params.find(name);
      ASSERT_NE(it, want.params.end()) << name;
      EXPECT_LT(RelativeError(values, it->second), 1e-5) << name << " on rank " << r;
      ++holders[name];
      if (IsExpertParameter(name)) ++experts;
    }
    // Each rank holds its share of the experts: 3 tensors each per MoE layer held.
    int moe_layers = 0;
    for (const auto& [name, values] : g.params) moe_layers += name.find(".mlp.gate.weight") != std::string::npos;
    EXPECT_EQ(experts, 3 * 4 / ep * moe_layers) << "rank " << r;
  }
  // Every one-process tensor is held somewhere: experts by dp ranks, dense by all.
  const int dp = static_cast<int>(got.size()) / (ep * tp * pp);
  for (const auto& [name, values] : want.params) {
    EXPECT_EQ(holders[name], (IsExpertParameter(name) ? dp : dp * ep) * tp) << name;
  }
}

class EpTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteFile(dir_ / "train.txt", testing::SyntheticText(20000, 1));
    testing::WriteFile(dir_ / "val.txt", testing::SyntheticText(4000, 2));
  }
  testing::ScratchDir dir_;
};

TEST_F(EpTrainingTest, Ep2MatchesOneProcessWithValidation) {
  const spec::JobSpec job = MoeJob(dir_ / "train.txt", dir_ / "val.txt");
  const RunResult want = Single(job);
  ASSERT_TRUE(want.val_loss.has_value());
  ExpectEqualsOneProcess(want, Mesh(job, 1, 2, 0), 2);
}

TEST_F(EpTrainingTest, Ep4MatchesOneProcess) {
  const spec::JobSpec job = MoeJob(dir_ / "train.txt", "");
  ExpectEqualsOneProcess(Single(job), Mesh(job, 1, 4, 0), 4);
}

TEST_F(EpTrainingTest, Ep2Dp2WithZero1MatchesOneProcess) {
  const spec::JobSpec job = MoeJob(dir_ / "train.txt", "");
  ExpectEqualsOneProcess(Single(job), Mesh(job, 2, 2, 1), 2);
}

// ZeRO 2 and 3, also under PP: the dense pieces of each rank's gradient
// shard are summed over EP (EP peers own the same ranges).
TEST_F(EpTrainingTest, Ep2Dp2WithZero2And3MatchesOneProcess) {
  const spec::JobSpec job = MoeJob(dir_ / "train.txt", "");
  const RunResult want = Single(job);
  for (int zero : {2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    ExpectEqualsOneProcess(want, Mesh(job, 2, 2, zero), 2);
  }
  for (int zero : {2, 3}) {  // ZeRO-3 under PP: each chunk's parameters gathered when it runs
    SCOPED_TRACE("zero " + std::to_string(zero) + " under pp2");
    ExpectEqualsOneProcess(want, Mesh(job, 2, 2, zero, {}, -1, {}, 1, /*pp=*/2), 2, 1, 2);
  }
}

// Under TP every rank runs the whole MoE layer on the replicated stream; the
// EP groups join the ranks of one TP index.
TEST_F(EpTrainingTest, Ep2Tp2MatchesOneProcess) {
  const spec::JobSpec job = MoeJob(dir_ / "train.txt", "");
  ExpectEqualsOneProcess(Single(job), Mesh(job, 1, 2, 0, {}, -1, {}, /*tp=*/2), 2, 2);
}

// Under PP each stage's EP group exchanges for its own MoE layers; the
// routing statistics of the stages make the whole model's.
TEST_F(EpTrainingTest, Ep2Pp2MatchesOneProcess) {
  const spec::JobSpec job = MoeJob(dir_ / "train.txt", dir_ / "val.txt");
  ExpectEqualsOneProcess(Single(job), Mesh(job, 1, 2, 0, {}, -1, {}, 1, /*pp=*/2), 2, 1, 2);
}

// Without EP the MoE layer runs under PP as well (the same statistics path).
TEST_F(EpTrainingTest, MoePp2MatchesOneProcess) {
  const spec::JobSpec job = MoeJob(dir_ / "train.txt", "");
  ExpectEqualsOneProcess(Single(job), Mesh(job, 1, 1, 0, {}, -1, {}, 1, /*pp=*/2), 1, 1, 2);
}

// A checkpoint written by an EP layout (each EP rank its experts' pieces
// under their global names, the one format of every layout) resumes under
// another EP size, under dp x ep with ZeRO 1 and 2, ep x tp, ep x pp and on
// one process, and a one-process checkpoint resumes under each of them, each
// continuing exactly as the uninterrupted one-process run (the selection
// biases travel in the state, moe_bias, gathered over pp).
TEST_F(EpTrainingTest, CheckpointsOfAnEpLayoutLoadUnderAnyEpSizeAndOneProcess) {
  const spec::JobSpec job = MoeJob(dir_ / "train.txt", "");
  const RunResult want = Single(job);
  for (const auto& [dp, ep, zero, tp, pp] : {std::tuple{1, 1, 0, 1, 1}, std::tuple{1, 2, 0, 1, 1},
                                              std::tuple{2, 2, 1, 1, 1},
                                              std::tuple{1, 2, 0, 2, 1}, std::tuple{1, 2, 0, 1, 2},
                                              std::tuple{2, 2, 3, 1, 1}}) {
    const std::string root = dir_ / ("ckpt_dp" + std::to_string(dp) + "_ep" + std::to_string(ep) + "_tp" +
                                     std::to_string(tp) + "_pp" + std::to_string(pp));
    Mesh(job, dp, ep, zero, {}, /*until=*/2, [&](TrainingLoop& loop) {
      auto saved = loop.SaveCheckpoint(root);
      ASSERT_TRUE(saved.ok()) << saved.status();
    }, tp, pp);
    auto restore = [&](TrainingLoop& loop) {
      auto loaded = loop.RestoreNewest(root);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      EXPECT_EQ(loaded->step, 2);
    };
    RunResult tail = want;  // steps 3 and 4 of the uninterrupted run
    tail.losses.erase(tail.losses.begin(), tail.losses.begin() + 2);
    tail.loads.erase(tail.loads.begin(), tail.loads.begin() + 2);
    SCOPED_TRACE("written by dp" + std::to_string(dp) + " x ep" + std::to_string(ep) + " x tp" +
                 std::to_string(tp) + " x pp" + std::to_string(pp));
    ExpectEqualsOneProcess(tail, {Single(job, restore)}, 1);
    ExpectEqualsOneProcess(tail, Mesh(job, 1, 4, 0, restore), 4);
    ExpectEqualsOneProcess(tail, Mesh(job, 2, 2, 1, restore), 2);
    ExpectEqualsOneProcess(tail, Mesh(job, 1, 2, 0, restore, -1, {}, /*tp=*/2), 2, 2);
    ExpectEqualsOneProcess(tail, Mesh(job, 1, 2, 0, restore, -1, {}, 1, /*pp=*/2), 2, 1, 2);
    ExpectEqualsOneProcess(tail, Mesh(job, 2, 2, 2, restore), 2);
  }
}

TEST_F(EpTrainingTest, RefusesWhatTheEngineCannotRun) {
  spec::JobSpec uneven = MoeJob(dir_ / "train.txt", "");
  uneven.parallelism.ep = 2;
  uneven.model.moe.num_experts = 3;
  uneven.model.moe.top_k = 1;
  spec::JobSpec dense = MoeJob(dir_ / "train.txt", "");
  dense.parallelism.ep = 2;
  dense.model.moe = {};
  const std::pair<spec::JobSpec, std::string> cases[] = {
      {uneven, "model.moe.num_experts"}, {dense, "parallelism.ep"}};
  comm::InProcessStore store;
  auto group = comm::testing::MakeGroup(store, 2, absl::Seconds(30), "ep");
  comm::testing::RunRanks(group, [&](int, comm::Communicator& c) {
    auto ctx = ParallelContext::Make(0, 1, nullptr, nullptr, nullptr, nullptr, nullptr, &c);
    ASSERT_TRUE(ctx.ok());
    for (const auto& [job, field] : cases) {
      auto loop = TrainingLoop::Create(job, *ctx);
      ASSERT_FALSE(loop.ok()) << field;
      EXPECT_NE(loop.status().message().find(field), std::string::npos) << loop.status();
    }
  });
}

}  // namespace
}  // namespace loom::engine
