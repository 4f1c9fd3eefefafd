// Parameter counts against the published sizes of real checkpoints, and the
// FLOPs-per-token formulas.
#include "planner/model_math.h"

#include "gtest/gtest.h"

namespace loom::planner {
namespace {

ModelShape Llama(int64_t vocab, int64_t h, int64_t layers, int64_t heads, int64_t kv, int64_t ffn,
                 bool tied) {
  ModelShape m;
  m.vocab_size = vocab;
  m.hidden_size = h;
  m.num_layers = layers;
  m.num_heads = heads;
  m.num_kv_heads = kv;
  m.ffn_hidden_size = ffn;
  m.tie_embeddings = tied;
  return m;
}

// Sizes as the Hugging Face checkpoints report them (sum of tensor numels).
TEST(CountParams, Llama2_7B) {
  EXPECT_EQ(CountParams(Llama(32000, 4096, 32, 32, 32, 11008, false)).total, 6738415616);
}

TEST(CountParams, Llama3_8BWithGqa) {
  EXPECT_EQ(CountParams(Llama(128256, 4096, 32, 32, 8, 14336, false)).total, 8030261248);
}

TEST(CountParams, Llama32_1BTied) {
  EXPECT_EQ(CountParams(Llama(128256, 2048, 16, 32, 8, 8192, true)).total, 1235814400);
}

TEST(CountParams, Gpt2SmallWithBiasesAndPositions) {
  ModelShape m = Llama(50257, 768, 12, 12, 12, 3072, true);
  m.gated_mlp = false;
  m.linear_bias = true;
  m.layer_norm = true;
  m.learned_positions = 1024;
  EXPECT_EQ(CountParams(m).total, 124439808);
}

TEST(CountParams, BreakdownAddsUp) {
  const ModelShape m = Llama(1000, 64, 3, 4, 2, 160, false);
  const ParamCount c = CountParams(m);
  // q and o: 64x64 each; k and v: 64x32 each; gate, up, down: 64x160 each.
  EXPECT_EQ(c.layer_linear, 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160);
  EXPECT_EQ(c.layer_replicated, 2 * 64);
  EXPECT_EQ(c.embedding, 64000);
  EXPECT_EQ(c.lm_head, 64000);
  EXPECT_EQ(c.total, c.embedding + c.lm_head + c.final_norm + 3 * c.per_layer());
}

TEST(Flops, ModelAndHardwareFlopsPerToken) {
  const ModelShape m = Llama(32000, 4096, 32, 32, 32, 11008, false);
  const double n = 6738415616.0;
  const double attention = 12.0 * 32 * 4096 * 2048;
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(m, 2048), 6 * n + attention);
  EXPECT_DOUBLE_EQ(HardwareFlopsPerToken(m, 2048, spec::Recompute::kNone), 6 * n + attention);
  EXPECT_DOUBLE_EQ(HardwareFlopsPerToken(m, 2048, spec::Recompute::kFull), 8 * n + attention * 4 / 3);
  EXPECT_DOUBLE_EQ(HardwareFlopsPerToken(m, 2048, spec::Recompute::kSelective),
                   6 * n + attention * 4 / 3);
}

// [moe] Mixtral-8x7B as its checkpoint reports it: 46.7B parameters, 12.9B
// active (two of eight experts per token).
TEST(CountParams, Mixtral8x7BTotalAndActive) {
  ModelShape m = Llama(32000, 4096, 32, 32, 8, 14336, false);
  m.num_experts = 8;
  m.top_k = 2;
  m.expert_ffn = 14336;
  const ParamCount c = CountParams(m);
  EXPECT_EQ(c.total, 46702792704);
  EXPECT_EQ(c.experts, 32LL * 8 * 3 * 4096 * 14336);
  EXPECT_EQ(c.active, 46702792704 - 32LL * 6 * 3 * 4096 * 14336);
  // MFU counts the active parameters.
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(m, 2048),
                   6.0 * c.active + 12.0 * 32 * 4096 * 2048);
}

TEST(CountParams, MoeWithDenseFirstLayersAndSharedExperts) {
  spec::ModelSpec s;
  s.vocab_size = 1000;
  s.hidden_size = 64;
  s.num_layers = 3;
  s.num_heads = 4;
  s.num_kv_heads = 4;
  s.ffn_hidden_size = 160;
  s.moe.num_experts = 4;
  s.moe.top_k = 2;
  s.moe.expert_ffn_hidden_size = 32;
  s.moe.num_shared_experts = 1;
  s.moe.first_dense_layers = 1;
  const ModelShape m = ModelShapeFromSpec(s);
  EXPECT_EQ(m.moe_layers(), 2);
  const ParamCount c = CountParams(m);
  const int64_t attention = 4 * 64 * 64, norms = 2 * 64;
  const int64_t dense = attention + 3 * 64 * 160 + norms;
  const int64_t moe = attention + 4 * 64 + 3 * 64 * 32 + norms + 4 * 3 * 64 * 32;
  EXPECT_EQ(c.total, 2 * 64000 + 64 + dense + 2 * moe);
  EXPECT_EQ(c.active, c.total - 2 * 2 * 3 * 64 * 32);
  EXPECT_DOUBLE_EQ(m.ActiveFfnWidth(), (160.0 + 2 * (2 * 32 + 32)) / 3);
}

TEST(ModelShapeFromSpec, ZeroKvHeadsMeansMultiHead) {
  spec::ModelSpec s;
  s.num_heads = 8;
  s.num_kv_heads = 0;
  EXPECT_EQ(ModelShapeFromSpec(s).num_kv_heads, 8);
  s.num_kv_heads = 2;
  EXPECT_EQ(ModelShapeFromSpec(s).num_kv_heads, 2);
}

}  // namespace
}  // namespace loom::planner
