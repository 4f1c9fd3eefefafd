// Model parts (LlamaModel restricted to a chunk of layers) against the whole
// model: two or three parts chained by hand give the whole model's loss and
// every gradient; a part holds exactly its tensors with the whole model's
// initial values; the plan derived from the spec matches the partition rules.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/model_tp/tp_test_util.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/model/parameter_layout.h"
#include "worker/engine/tensor_parallel/tp_plan.h"
#include "worker/engine/pipeline_parallel/pipeline_plan.h"

namespace loom::engine {
namespace {

spec::ModelSpec Model() {
  spec::ModelSpec c;
  c.vocab_size = 37;
  c.hidden_size = 32;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 64;
  c.max_seq_len = 16;
  return c;
}

TEST(PipelinePartTest, ChainedPartsEqualTheWholeModel) {
  const spec::ModelSpec c = Model();
  const int64_t batch = 2, seq = 8, t = batch * seq;
  std::vector<int32_t> inputs(t), targets(t);
  for (int64_t i = 0; i < t; ++i) {
    inputs[i] = static_cast<int32_t>((i * 7 + 3) % c.vocab_size);
    targets[i] = static_cast<int32_t>((i * 5 + 1) % c.vocab_size);
  }
  LlamaModel whole(c, spec::Recompute::kNone, kernels::cpu::MakeCpuOps());
  whole.InitParameters(11);
  const float want = whole.ForwardBackward(inputs.data(), targets.data(), batch, seq, 0.5f);
  const testing::TensorMap want_params = testing::ToMap(whole.Parameters());
  const testing::TensorMap want_grads = testing::ToMap(whole.Gradients());

  // embedding + layer 0 | layers 1, 2 | layer 3 + head
  LlamaModel a(c, spec::Recompute::kNone, kernels::cpu::MakeCpuOps(), {}, {0, 1, true, false});
  LlamaModel b(c, spec::Recompute::kSelective, kernels::cpu::MakeCpuOps(), {}, {1, 2, false, false});
  LlamaModel z(c, spec::Recompute::kFull, kernels::cpu::MakeCpuOps(), {}, {3, 1, false, true});
  testing::TensorMap got_params, got_grads;
  for (LlamaModel* m : {&a, &b, &z}) m->InitParameters(11);
  const int64_t n = a.PartActivationFloats(batch, seq);
  ASSERT_EQ(n, t * c.hidden_size);
  std::vector<float> x1(n), x2(n), d2(n), d1(n);
  a.PartForward(inputs.data(), nullptr, batch, seq, x1.data());
  b.PartForward(nullptr, x1.data(), batch, seq, x2.data());
  const float eval = z.PartForwardLoss(nullptr, x2.data(), targets.data(), batch, seq);
  const float loss = z.PartForwardBackward(nullptr, x2.data(), targets.data(), nullptr, batch, seq,
                                           0.5f, d2.data());
  EXPECT_EQ(b.PartForwardBackward(nullptr, x1.data(), nullptr, d2.data(), batch, seq, 0.5f,
                                  d1.data()),
            0.0f);
  a.PartForwardBackward(inputs.data(), nullptr, nullptr, d1.data(), batch, seq, 0.5f, nullptr);
  for (LlamaModel* m : {&a, &b, &z}) {
    ASSERT_TRUE(m->status().ok()) << m->status();
    for (auto& [k, v] : testing::ToMap(m->Parameters())) got_params[k] = v;
    for (auto& [k, v] : testing::ToMap(m->Gradients())) got_grads[k] = v;
  }
  EXPECT_NEAR(loss, want, 1e-6 * std::abs(want));
  EXPECT_NEAR(eval, want, 1e-6 * std::abs(want));
  testing::ExpectMapsNear(got_params, want_params, 0.0, "initial parameters");
  testing::ExpectMapsNear(got_grads, want_grads, 1e-5, "gradients");
  EXPECT_EQ(a.Parameters().front().name, "model.embed_tokens.weight");
  EXPECT_EQ(b.Parameters().front().name, "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(z.Parameters().back().name, "lm_head.weight");
  EXPECT_EQ(a.NumParameters() + b.NumParameters() + z.NumParameters(), whole.NumParameters());
}

// A tied head on a stage without the embedding holds a copy of the embedding
// (same name, shape and init stream), last in its part.
TEST(PipelinePartTest, TiedHeadWithoutTheEmbeddingHoldsACopy) {
  spec::ModelSpec c = Model();
  c.tie_embeddings = true;
  EXPECT_TRUE(CheckModelPart(c, {0, 2, true, false}).ok());
  EXPECT_FALSE(CheckModelPart(Model(), {3, 2, false, true}).ok());
  const TpPlan whole = MakeTpPlan(c, 0, 1, false);
  const ParameterLayout all = MakeParameterLayout(c, whole);
  const ParameterLayout head = MakeParameterLayout(c, whole, {2, 2, false, true});
  EXPECT_EQ(head.embed, -1);
  ASSERT_FALSE(head.entries.empty());
  const ParameterEntry& copy = head.entries.back();
  EXPECT_EQ(copy.name, "model.embed_tokens.weight");
  EXPECT_EQ(head.lm_head, copy.offset);
  EXPECT_EQ(copy.init_index, all.entries.front().init_index);
  EXPECT_EQ(copy.shape, all.entries.front().shape);
  const ParameterLayout first = MakeParameterLayout(c, whole, {0, 2, true, false});
  EXPECT_EQ(first.lm_head, -1);
}

TEST(PipelinePartTest, PlanFollowsThePartitionAndSchedule) {
  spec::JobSpec job;
  job.model = Model();
  job.model.num_layers = 8;
  job.train.seq_len = 16;
  job.parallelism.schedule = spec::Schedule::kInterleaved;
  job.parallelism.virtual_stages = 2;
  std::vector<int64_t> all;
  for (int64_t s = 0; s < 2; ++s) {
    absl::StatusOr<PipelinePlan> plan = MakePipelinePlan(job, s, 2, 4);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->chunks.size(), 2u);
    EXPECT_EQ(plan->chunks[0].virtual_stage, s);
    EXPECT_EQ(plan->chunks[1].virtual_stage, 2 + s);
    EXPECT_EQ(plan->chunks[0].embedding, s == 0);
    EXPECT_EQ(plan->chunks[1].head, s == 1);
    EXPECT_FALSE(plan->instructions.empty());
    for (int64_t l : StageLayers(*plan)) all.push_back(l);
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  job.parallelism.schedule = spec::Schedule::k1F1B;
  EXPECT_FALSE(MakePipelinePlan(job, 0, 2, 4).ok());  // virtual stages need interleaved
}

}  // namespace
}  // namespace loom::engine
