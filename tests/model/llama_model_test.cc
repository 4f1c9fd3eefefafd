// The Llama model against an independent double-precision reference
// (reference_llama.h): the loss, and every parameter's gradient against central
// finite differences of the reference; then the properties the engine relies
// on: names and order, deterministic init, bit-identical recompute modes and
// reruns, tied embeddings, accumulation by loss_scale, ignored targets.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/model/reference_llama.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine {
namespace {

spec::ModelSpec TinyConfig(bool tied) {
  spec::ModelSpec c;
  c.vocab_size = 11;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 24;
  c.max_seq_len = 80;
  c.rope_theta = 10000.0;
  c.tie_embeddings = tied;
  c.norm_eps = 1e-5;
  return c;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
  int64_t batch, seq;
};

Batch RandomBatch(int64_t batch, int64_t seq, int32_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  Batch b{{}, {}, batch, seq};
  for (int64_t i = 0; i < batch * seq; ++i) {
    b.inputs.push_back(dist(gen));
    b.targets.push_back(dist(gen));
  }
  return b;
}

// Weights larger than the 0.02 init, so every path carries signal that the
// finite differences can see.
void RandomizeParameters(LlamaModel& model, uint32_t seed) {
  std::mt19937 gen(seed);
  for (const TensorView& v : model.Parameters()) {
    const bool norm = v.shape.size() == 1;
    std::uniform_real_distribution<float> dist(norm ? 0.5f : -0.4f, norm ? 1.5f : 0.4f);
    for (int64_t i = 0; i < v.numel(); ++i) v.data[i] = dist(gen);
  }
}

testing::ParamMap ToParamMap(LlamaModel& model) {
  testing::ParamMap map;
  for (const TensorView& v : model.Parameters()) map[v.name].assign(v.data, v.data + v.numel());
  return map;
}

std::vector<float> Flatten(const std::vector<TensorView>& views) {
  std::vector<float> out;
  for (const TensorView& v : views) out.insert(out.end(), v.data, v.data + v.numel());
  return out;
}

TEST(LlamaModelTest, ParameterNamesShapesAndOrder) {
  LlamaModel untied(TinyConfig(false), spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  const auto p = untied.Parameters();
  ASSERT_EQ(p.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(p[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(p[0].shape, (std::vector<int64_t>{11, 16}));
  const char* layer_names[] = {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                               "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
                               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
  for (int l = 0; l < 2; ++l)
    for (int i = 0; i < 9; ++i)
      EXPECT_EQ(p[1 + l * 9 + i].name,
                "model.layers." + std::to_string(l) + "." + layer_names[i] + ".weight");
  EXPECT_EQ(p[2].shape, (std::vector<int64_t>{16, 16}));  // q: 4 heads x 4
  EXPECT_EQ(p[3].shape, (std::vector<int64_t>{8, 16}));   // k: 2 kv heads x 4
  EXPECT_EQ(p[5].shape, (std::vector<int64_t>{16, 16}));  // o
  EXPECT_EQ(p[7].shape, (std::vector<int64_t>{24, 16}));  // gate
  EXPECT_EQ(p[9].shape, (std::vector<int64_t>{16, 24}));  // down
  EXPECT_EQ(p[19].name, "model.norm.weight");
  EXPECT_EQ(p[20].name, "lm_head.weight");
  int64_t total = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].data, p[0].data + total) << "contiguous in order";
    total += p[i].numel();
  }
  EXPECT_EQ(untied.NumParameters(), total);
  const auto g = untied.Gradients();
  ASSERT_EQ(g.size(), p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(g[i].name, p[i].name);
    EXPECT_EQ(g[i].shape, p[i].shape);
  }
  LlamaModel tied(TinyConfig(true), spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  EXPECT_EQ(tied.Parameters().size(), p.size() - 1);
  EXPECT_EQ(tied.Parameters().back().name, "model.norm.weight");
  EXPECT_EQ(tied.NumParameters(), total - 11 * 16);
}

TEST(LlamaModelTest, InitIsDeterministicFromTheSeed) {
  LlamaModel a(TinyConfig(false), spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  LlamaModel b(TinyConfig(false), spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  a.InitParameters(7);
  b.InitParameters(7);
  const auto pa = Flatten(a.Parameters());
  EXPECT_EQ(pa, Flatten(b.Parameters()));
  b.InitParameters(8);
  EXPECT_NE(pa, Flatten(b.Parameters()));
  const auto views = a.Parameters();
  for (float x : std::vector<float>(views[1].data, views[1].data + 16)) EXPECT_EQ(x, 1.0f);
  // The embedding's sample std is near 0.02 (176 samples: within 25%).
  double ss = 0;
  for (int64_t i = 0; i < views[0].numel(); ++i) ss += views[0].data[i] * views[0].data[i];
  EXPECT_NEAR(std::sqrt(ss / views[0].numel()), 0.02, 0.005);
}

// The whole model's gradient against central differences (step 1e-4) of the
// double reference. The model's gradients are fp32, accurate to ~1e-6 of their
// scale, so each entry must be within 2e-4 of its tensor's largest gradient;
// a missing or wrong term is off by far more.
void CheckModelGradient(bool tied, int64_t batch, int64_t seq) {
  SCOPED_TRACE(tied ? "tied" : "untied");
  const spec::ModelSpec c = TinyConfig(tied);
  LlamaModel model(c, spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  RandomizeParameters(model, 3);
  const Batch b = RandomBatch(batch, seq, 11, 4);
  model.ZeroGradients();
  const float loss = model.ForwardBackward(b.inputs.data(), b.targets.data(), batch, seq, 1.0f);
  testing::ParamMap params = ToParamMap(model);
  const double ref_loss = testing::ReferenceLlamaLoss(c, params, b.inputs, b.targets, batch, seq);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);

  std::mt19937 gen(5);
  for (const TensorView& g : model.Gradients()) {
    SCOPED_TRACE(g.name);
    double scale = 1e-6;
    for (int64_t i = 0; i < g.numel(); ++i) scale = std::max(scale, std::abs(double(g.data[i])));
    std::vector<double>& p = params[g.name];
    std::uniform_int_distribution<int64_t> pick(0, g.numel() - 1);
    for (int s = 0; s < 6; ++s) {
      const int64_t i = pick(gen);
      const double x0 = p[i];
      p[i] = x0 + 1e-4;
      const double up = testing::ReferenceLlamaLoss(c, params, b.inputs, b.targets, batch, seq);
      p[i] = x0 - 1e-4;
      const double down = testing::ReferenceLlamaLoss(c, params, b.inputs, b.targets, batch, seq);
      p[i] = x0;
      ASSERT_NEAR(g.data[i], (up - down) / 2e-4, 2e-4 * scale) << "index " << i;
    }
  }
}

TEST(LlamaModelTest, GradientMatchesFiniteDifferencesUntied) { CheckModelGradient(false, 2, 9); }
TEST(LlamaModelTest, GradientMatchesFiniteDifferencesTied) { CheckModelGradient(true, 2, 9); }
// Sequence past one 64-row attention tile.
TEST(LlamaModelTest, GradientMatchesFiniteDifferencesLongSequence) {
  CheckModelGradient(false, 1, 70);
}

std::pair<float, std::vector<float>> RunStep(spec::Recompute mode, bool tied, const Batch& b,
                                             float scale = 1.0f, int repeats = 1) {
  LlamaModel model(TinyConfig(tied), mode, kernels::cpu::MakeCpuOps());
  RandomizeParameters(model, 11);
  float loss = 0;
  for (int r = 0; r < repeats; ++r)
    loss = model.ForwardBackward(b.inputs.data(), b.targets.data(), b.batch, b.seq, scale);
  return {loss, Flatten(model.Gradients())};
}

TEST(LlamaModelTest, RecomputeModesGiveBitIdenticalGradients) {
  const Batch b = RandomBatch(3, 70, 11, 12);
  const auto none = RunStep(spec::Recompute::kNone, false, b);
  const auto selective = RunStep(spec::Recompute::kSelective, false, b);
  const auto full = RunStep(spec::Recompute::kFull, false, b);
  EXPECT_EQ(none.first, selective.first);
  EXPECT_EQ(none.first, full.first);
  EXPECT_EQ(none.second, selective.second);
  EXPECT_EQ(none.second, full.second);
}

TEST(LlamaModelTest, RerunsAreBitIdentical) {
  const Batch b = RandomBatch(2, 40, 11, 13);
  const auto first = RunStep(spec::Recompute::kNone, true, b);
  const auto second = RunStep(spec::Recompute::kNone, true, b);
  EXPECT_EQ(first.first, second.first);
  EXPECT_EQ(first.second, second.second);
}

TEST(LlamaModelTest, LossScaleAccumulatesAcrossMicroBatches) {
  const Batch b = RandomBatch(2, 20, 11, 14);
  const auto once = RunStep(spec::Recompute::kNone, false, b, 1.0f, 1);
  const auto twice_half = RunStep(spec::Recompute::kNone, false, b, 0.5f, 2);
  EXPECT_EQ(once.first, twice_half.first);
  // Each half-scaled gradient is exactly half of the full one, but adding it
  // into an existing sum rounds differently: equal to float rounding only.
  ASSERT_EQ(once.second.size(), twice_half.second.size());
  for (size_t i = 0; i < once.second.size(); ++i)
    ASSERT_NEAR(twice_half.second[i], once.second[i], 1e-6 * (1 + std::abs(once.second[i]))) << i;
}

TEST(LlamaModelTest, TiedEmbeddingGradientIsEmbeddingPlusHeadGradient) {
  const Batch b = RandomBatch(2, 20, 11, 15);
  LlamaModel tied(TinyConfig(true), spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  LlamaModel untied(TinyConfig(false), spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  RandomizeParameters(tied, 16);
  const auto tp = tied.Parameters();
  auto up = untied.Parameters();
  for (size_t i = 0; i < tp.size(); ++i) std::copy(tp[i].data, tp[i].data + tp[i].numel(), up[i].data);
  std::copy(tp[0].data, tp[0].data + tp[0].numel(), up.back().data);  // lm_head = embedding
  const float lt = tied.ForwardBackward(b.inputs.data(), b.targets.data(), 2, 20, 1.0f);
  const float lu = untied.ForwardBackward(b.inputs.data(), b.targets.data(), 2, 20, 1.0f);
  EXPECT_EQ(lt, lu);
  const auto gt = tied.Gradients(), gu = untied.Gradients();
  for (int64_t i = 0; i < gt[0].numel(); ++i)
    ASSERT_NEAR(gt[0].data[i], gu[0].data[i] + gu.back().data[i], 1e-6) << i;
  for (size_t t = 1; t < gt.size(); ++t)
    for (int64_t i = 0; i < gt[t].numel(); ++i) ASSERT_EQ(gt[t].data[i], gu[t].data[i]);
}

TEST(LlamaModelTest, ForwardLossMatchesTrainingLossAndLeavesGradients) {
  const Batch b = RandomBatch(2, 30, 11, 17);
  LlamaModel model(TinyConfig(false), spec::Recompute::kSelective, kernels::cpu::MakeCpuOps());
  model.InitParameters(1);
  const float train = model.ForwardBackward(b.inputs.data(), b.targets.data(), 2, 30, 1.0f);
  const auto grads = Flatten(model.Gradients());
  EXPECT_EQ(model.ForwardLoss(b.inputs.data(), b.targets.data(), 2, 30), train);
  EXPECT_EQ(Flatten(model.Gradients()), grads);
  // Near-uniform predictions at init: loss close to log(vocab).
  EXPECT_NEAR(train, std::log(11.0), 0.1);
}

TEST(LlamaModelTest, NegativeTargetsAreIgnored) {
  Batch b = RandomBatch(1, 10, 11, 18);
  LlamaModel model(TinyConfig(false), spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  RandomizeParameters(model, 19);
  const float full = model.ForwardLoss(b.inputs.data(), b.targets.data(), 1, 10);
  b.targets[4] = -100;
  const double ref = testing::ReferenceLlamaLoss(model.config(), ToParamMap(model), b.inputs,
                                                 b.targets, 1, 10);
  const float partial = model.ForwardLoss(b.inputs.data(), b.targets.data(), 1, 10);
  EXPECT_NE(full, partial);
  EXPECT_NEAR(partial, ref, 1e-5 * ref);
}

}  // namespace
}  // namespace loom::engine
