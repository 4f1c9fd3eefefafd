// The MoE layer (worker/engine/model/moe_*): the router's selection, weights,
// capacity drops and permuted order; its backward against finite differences;
// the bias rule; and in the model: names, recompute modes, reruns, loss-scale
// accumulation and the statistics. The PyTorch reference
// (tests/engine/torch_reference.py) checks losses and gradients end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/model/moe_router.h"
#include "worker/engine/model/moe_stats.h"

namespace loom::engine {
namespace {

std::vector<float> RandomLogits(int64_t n, uint32_t seed, float scale = 2.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = dist(gen);
  return out;
}

MoeDims Dims(int64_t tokens, int64_t experts, int64_t k, RouterScore score) {
  MoeDims d;
  d.tokens = tokens;
  d.hidden = 8;
  d.num_experts = experts;
  d.top_k = k;
  d.expert_ffn = 4;
  d.score = score;
  d.aux_loss_coef = 0.1;
  return d;
}

TEST(MoeRouter, SelectsTopKWithRenormalizedWeightsAndAPermutedOrder) {
  for (RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    const MoeDims d = Dims(7, 5, 2, score);
    const std::vector<float> logits = RandomLogits(7 * 5, 1);
    double aux = 0;
    const MoeRouting r = Route(d, logits.data(), nullptr, &aux);
    EXPECT_GT(aux, 0);
    int64_t total = 0;
    for (int64_t e = 0; e < 5; ++e) total += r.counts[e];
    EXPECT_EQ(total, 14);
    EXPECT_EQ(r.dropped, 0);
    for (int64_t t = 0; t < 7; ++t) {
      const int32_t first = r.expert[t * 2], second = r.expert[t * 2 + 1];
      EXPECT_NE(first, second);
      EXPECT_GE(logits[t * 5 + first], logits[t * 5 + second]);  // scores are monotone
      for (int64_t e = 0; e < 5; ++e) {
        if (e != first && e != second) EXPECT_LE(logits[t * 5 + e], logits[t * 5 + second]);
      }
      EXPECT_NEAR(r.weight[t * 2] + r.weight[t * 2 + 1], 1.0, 1e-6);
    }
    // Permuted order: by expert, each expert's rows in assignment order.
    for (int64_t row = 1; row < r.kept_rows(); ++row) {
      const int32_t a = r.assignment_of[row - 1], b = r.assignment_of[row];
      EXPECT_TRUE(r.expert[a] < r.expert[b] || (r.expert[a] == r.expert[b] && a < b));
      EXPECT_EQ(r.row_of[b], row);
    }
  }
}

TEST(MoeRouter, BiasChangesTheSelectionButNotTheWeights) {
  const MoeDims d = Dims(6, 4, 1, RouterScore::kSigmoid);
  const std::vector<float> logits = RandomLogits(6 * 4, 2);
  const std::vector<float> bias = {0, 0, 10, 0};  // expert 2 wins every token
  const MoeRouting r = Route(d, logits.data(), bias.data(), nullptr);
  for (int64_t t = 0; t < 6; ++t) {
    EXPECT_EQ(r.expert[t], 2);
    EXPECT_FLOAT_EQ(r.weight[t], 1.0f);  // top-1 renormalized
  }
  const MoeDims d2 = Dims(6, 4, 2, RouterScore::kSigmoid);
  const MoeRouting r2 = Route(d2, logits.data(), bias.data(), nullptr);
  for (int64_t t = 0; t < 6; ++t) {
    const float s2 = r2.scores[t * 4 + 2], so = r2.scores[t * 4 + r2.expert[t * 2 + 1]];
    EXPECT_EQ(r2.expert[t * 2], 2);
    EXPECT_NEAR(r2.weight[t * 2], s2 / (s2 + so), 1e-6);  // the score, not score + bias
  }
}

TEST(MoeRouter, CapacityDropsOverflowInAssignmentOrder) {
  MoeDims d = Dims(8, 2, 1, RouterScore::kSoftmax);
  std::vector<float> logits(16);
  for (int64_t t = 0; t < 8; ++t) {  // tokens 0-5 prefer expert 0, 6-7 expert 1
    logits[t * 2] = t < 6 ? 1.0f : -1.0f;
    logits[t * 2 + 1] = -logits[t * 2];
  }
  d.capacity = ExpertCapacity(1.0, 8, 1, 2);
  EXPECT_EQ(d.capacity, 4);
  const MoeRouting r = Route(d, logits.data(), nullptr, nullptr);
  EXPECT_EQ(r.dropped, 2);
  EXPECT_EQ(r.counts[0], 4);
  EXPECT_EQ(r.counts[1], 2);
  EXPECT_EQ(r.routed[0], 6);  // the load counts what the router chose
  EXPECT_EQ(r.row_of[4], -1);
  EXPECT_EQ(r.row_of[5], -1);
  EXPECT_EQ(r.row_of[3], 3);
  EXPECT_EQ(r.row_of[6], 4);
  EXPECT_EQ(ExpertCapacity(0.0, 8, 1, 2), 0);
}

// The router's backward against central differences of the objective
// sum_a c_a * weight_a + scale * aux (the selection stays fixed for a small step).
TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  for (RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    SCOPED_TRACE(score == RouterScore::kSoftmax ? "softmax" : "sigmoid");
    const MoeDims d = Dims(5, 6, 3, score);
    std::vector<float> logits = RandomLogits(5 * 6, 3, 1.0f);
    const std::vector<float> c = RandomLogits(5 * 3, 4, 1.0f);
    const double scale = 0.7;
    auto objective = [&](const std::vector<float>& l) {
      double aux = 0;
      const MoeRouting r = Route(d, l.data(), nullptr, &aux);
      double sum = scale * aux;
      for (size_t a = 0; a < c.size(); ++a) sum += c[a] * static_cast<double>(r.weight[a]);
      return sum;
    };
    const MoeRouting r = Route(d, logits.data(), nullptr, nullptr);
    const std::vector<float> grad = RouterBackward(d, r, c, scale);
    for (size_t i = 0; i < logits.size(); ++i) {
      const float x0 = logits[i];
      logits[i] = x0 + 1e-2f;
      const double up = objective(logits);
      logits[i] = x0 - 1e-2f;
      const double down = objective(logits);
      logits[i] = x0;
      EXPECT_NEAR(grad[i], (up - down) / 2e-2, 2e-4) << "logit " << i;
    }
  }
}

TEST(MoeRouter, BiasMovesTowardBalanceBySign) {
  const double load[4] = {10, 2, 4, 4};  // mean 5
  float bias[4] = {0, 0, 0.5f, 0};
  UpdateSelectionBias(load, 4, 0.1, bias);
  EXPECT_FLOAT_EQ(bias[0], -0.1f);
  EXPECT_FLOAT_EQ(bias[1], 0.1f);
  EXPECT_FLOAT_EQ(bias[2], 0.6f);
  EXPECT_FLOAT_EQ(bias[3], 0.1f);
}

TEST(MoeStats, SummaryTakesTheWorstLayer) {
  MoeStepStats s;
  s.tokens_per_expert = {4, 4, 4, 4, 10, 2, 2, 2};
  s.dropped = 2;
  s.assignments = 32;
  s.aux_loss = 0.3;
  const MoeSummary m = SummarizeMoe(s, 4, 3);
  EXPECT_EQ(m.tokens_per_expert, (std::vector<double>{14, 6, 6, 6}));
  EXPECT_DOUBLE_EQ(m.tokens_min, 2);
  EXPECT_DOUBLE_EQ(m.tokens_max, 10);
  EXPECT_DOUBLE_EQ(m.imbalance, 2.5);
  EXPECT_DOUBLE_EQ(m.dropped_fraction, 2.0 / 32);
  EXPECT_DOUBLE_EQ(m.aux_loss, 0.1);
}

spec::ModelSpec MoeConfig() {
  spec::ModelSpec c;
  c.vocab_size = 11;
  c.hidden_size = 16;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 24;
  c.max_seq_len = 80;
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.expert_ffn_hidden_size = 8;
  c.moe.num_shared_experts = 1;
  c.moe.first_dense_layers = 1;
  c.moe.aux_loss_coef = 0.05;
  return c;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch RandomBatch(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, 10);
  Batch b;
  for (int64_t i = 0; i < n; ++i) {
    b.inputs.push_back(dist(gen));
    b.targets.push_back(dist(gen));
  }
  return b;
}

std::vector<float> Flatten(const std::vector<TensorView>& views) {
  std::vector<float> out;
  for (const TensorView& v : views) out.insert(out.end(), v.data, v.data + v.numel());
  return out;
}

TEST(MoeModel, NamesTheExpertsAndKeepsTheFirstLayersDense) {
  LlamaModel model(MoeConfig(), spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  std::vector<std::string> names;
  for (const TensorView& v : model.Parameters()) names.push_back(v.name);
  auto has = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  EXPECT_TRUE(has("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_FALSE(has("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_TRUE(has("model.layers.1.mlp.gate.weight"));
  EXPECT_TRUE(has("model.layers.2.mlp.experts.3.down_proj.weight"));
  EXPECT_TRUE(has("model.layers.2.mlp.shared_experts.up_proj.weight"));
  EXPECT_EQ(model.NumParameters(), MakeParameterLayout(MoeConfig()).total);
  const std::vector<TensorView> biases = model.ExpertBiases();
  ASSERT_EQ(biases.size(), 2u);
  EXPECT_EQ(biases[0].name, "model.layers.1.mlp.gate.e_score_correction_bias");
}

std::pair<float, std::vector<float>> RunStep(spec::ModelSpec c, spec::Recompute mode,
                                             const Batch& b, float scale = 1.0f, int repeats = 1) {
  LlamaModel model(c, mode, kernels::cpu::MakeCpuOps());
  model.InitParameters(7);
  // Larger weights than the init so routing differs between tokens.
  for (const TensorView& v : model.Parameters()) {
    if (v.name.find("mlp.gate.weight") != std::string::npos) {
      for (int64_t i = 0; i < v.numel(); ++i) v.data[i] *= 50;
    }
  }
  float loss = 0;
  for (int r = 0; r < repeats; ++r) {
    loss = model.ForwardBackward(b.inputs.data(), b.targets.data(), 2, 12, scale);
  }
  return {loss, Flatten(model.Gradients())};
}

TEST(MoeModel, RecomputeModesAndRerunsAreBitIdentical) {
  const Batch b = RandomBatch(24, 5);
  const auto none = RunStep(MoeConfig(), spec::Recompute::kNone, b);
  const auto selective = RunStep(MoeConfig(), spec::Recompute::kSelective, b);
  const auto full = RunStep(MoeConfig(), spec::Recompute::kFull, b);
  const auto again = RunStep(MoeConfig(), spec::Recompute::kNone, b);
  EXPECT_TRUE(std::isfinite(none.first));
  EXPECT_EQ(none.first, selective.first);
  EXPECT_EQ(none.first, full.first);
  EXPECT_EQ(none.second, selective.second);
  EXPECT_EQ(none.second, full.second);
  EXPECT_EQ(none.second, again.second);
}

TEST(MoeModel, LossScaleAccumulatesAndStatisticsCountEveryMicroBatch) {
  const Batch b = RandomBatch(24, 6);
  const auto once = RunStep(MoeConfig(), spec::Recompute::kNone, b, 1.0f);
  const auto twice = RunStep(MoeConfig(), spec::Recompute::kNone, b, 0.5f, 2);
  ASSERT_EQ(once.second.size(), twice.second.size());
  for (size_t i = 0; i < once.second.size(); ++i) {
    ASSERT_NEAR(once.second[i], twice.second[i], 1e-6 + 1e-5 * std::abs(once.second[i]));
  }
  spec::ModelSpec c = MoeConfig();
  c.moe.capacity_factor = 0.5;
  LlamaModel model(c, spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  model.InitParameters(7);
  model.ForwardBackward(b.inputs.data(), b.targets.data(), 2, 12, 0.5f);
  model.ForwardBackward(b.inputs.data(), b.targets.data(), 2, 12, 0.5f);
  const MoeStepStats stats = model.TakeMoeStats();
  ASSERT_EQ(stats.tokens_per_expert.size(), 8u);  // two MoE layers x four experts
  double routed = 0;
  for (double n : stats.tokens_per_expert) routed += n;
  EXPECT_EQ(routed, 2 * 2 * 24 * 2);  // micro-batches x layers x tokens x top_k
  EXPECT_EQ(stats.assignments, routed);
  EXPECT_GE(stats.dropped, 0.5 * routed - 1e-9);  // half the rows fit at most
  EXPECT_GT(stats.aux_loss, 0);
  EXPECT_TRUE(model.TakeMoeStats().tokens_per_expert.empty());  // taken: reset
  const MoeSummary s = SummarizeMoe(stats, 4, 2);
  EXPECT_GE(s.dropped_fraction, 0.5);
}

}  // namespace
}  // namespace loom::engine
