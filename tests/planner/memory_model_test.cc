// The memory model against hand-computed values: static bytes by recipe and
// ZeRO stage, activations per layer under TP/SP/CP/recompute, micro-batches
// in flight per schedule, logits on the last stage.
#include "planner/memory_model.h"

#include "gtest/gtest.h"

namespace loom::planner {
namespace {

// h=128, 4 heads (head_dim 32), 2 KV heads, ffn 384, vocab 256, 4 layers.
Workload Tiny(RecipeKind recipe = RecipeKind::kFp32, int64_t seq = 128, int64_t batch = 16) {
  ModelShape m;
  m.vocab_size = 256;
  m.hidden_size = 128;
  m.num_layers = 4;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.ffn_hidden_size = 384;
  return MakeWorkload(m, seq, batch, recipe);
}

PlannerConstants Plain() {
  PlannerConstants k;
  k.memory_overhead_bytes = 0;
  k.activation_factor = 1;
  k.logits_bytes_per_element = 4;
  k.attention_score_bytes = 0;
  return k;
}

TEST(Activations, PerLayerNoParallelism) {
  Layout l;
  l.micro_batch_size = 2;
  // Per token: norm/GEMM inputs 4h=512, Q and O 2h=256, K and V 2*64=128,
  // SwiGLU 3f=1152: 2048 elements of 4 bytes, 256 tokens.
  EXPECT_DOUBLE_EQ(ActivationBytesPerLayer(Tiny(), l, Plain()), 256.0 * 2048 * 4);
}

TEST(Activations, TensorAndSequenceParallel) {
  Layout l;
  l.micro_batch_size = 2;
  l.tp = 2;
  // Without SP the 4h inputs stay whole: 512 + (256 + 1152)/2 + 2*32 (one KV head each).
  EXPECT_DOUBLE_EQ(ActivationBytesPerLayer(Tiny(), l, Plain()), 256.0 * (512 + 704 + 64) * 4);
  l.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(ActivationBytesPerLayer(Tiny(), l, Plain()), 256.0 * (256 + 704 + 64) * 4);
}

TEST(Activations, KvHeadsReplicatedWhenTpExceedsThem) {
  Layout l;
  l.micro_batch_size = 2;
  l.tp = 4;
  l.sequence_parallel = true;
  // 2 KV heads over 4 ranks: each rank keeps one head (32 wide) for K and V.
  EXPECT_DOUBLE_EQ(ActivationBytesPerLayer(Tiny(), l, Plain()), 256.0 * (128 + 64 + 288 + 64) * 4);
}

TEST(Activations, ContextParallelAndRecompute) {
  Layout l;
  l.micro_batch_size = 2;
  l.cp = 2;
  EXPECT_DOUBLE_EQ(ActivationBytesPerLayer(Tiny(), l, Plain()), 128.0 * 2048 * 4);
  l.recompute = spec::Recompute::kFull;
  EXPECT_DOUBLE_EQ(ActivationBytesPerLayer(Tiny(), l, Plain()), 128.0 * 128 * 4);
  l.cp = 1;
  l.recompute = spec::Recompute::kSelective;
  PlannerConstants k = Plain();
  k.attention_score_bytes = 4;
  // Selective recompute drops the attention scores that unfused attention saves.
  EXPECT_DOUBLE_EQ(ActivationBytesPerLayer(Tiny(), l, k), 256.0 * 2048 * 4);
  l.recompute = spec::Recompute::kNone;
  EXPECT_DOUBLE_EQ(ActivationBytesPerLayer(Tiny(), l, k), 256.0 * (2048 * 4 + 4 * 128 * 4));
}

TEST(InFlight, Schedules) {
  Layout l;
  l.pp = 4;
  l.grad_accum = 8;
  l.schedule = spec::Schedule::k1F1B;
  EXPECT_EQ(MicroBatchesInFlight(l, 0), 4);
  EXPECT_EQ(MicroBatchesInFlight(l, 3), 1);
  l.schedule = spec::Schedule::kAfab;
  EXPECT_EQ(MicroBatchesInFlight(l, 3), 8);
  l.schedule = spec::Schedule::kInterleaved;
  l.virtual_stages = 2;
  EXPECT_DOUBLE_EQ(MicroBatchesInFlight(l, 0), 4 * (1 + 3.0 / 8));
  l.grad_accum = 2;
  l.schedule = spec::Schedule::k1F1B;
  EXPECT_EQ(MicroBatchesInFlight(l, 0), 2);
  l.pp = 1;
  EXPECT_EQ(MicroBatchesInFlight(l, 0), 1);
}

TEST(LayersOnStage, RemainderGoesFirst) {
  EXPECT_EQ(LayersOnStage(10, 4, 0), 3);
  EXPECT_EQ(LayersOnStage(10, 4, 1), 3);
  EXPECT_EQ(LayersOnStage(10, 4, 2), 2);
  EXPECT_EQ(LayersOnStage(10, 4, 3), 2);
}

TEST(Memory, StaticBytesByRecipeAndZeroStage) {
  const Workload w = Tiny(RecipeKind::kBf16Fp32Accum);
  const double n = static_cast<double>(w.params.total);
  Layout l;
  l.dp = 4;
  l.grad_accum = 4;
  const PlannerConstants k = Plain();
  MemoryBreakdown m = EstimateMemory(w, l, k);
  EXPECT_DOUBLE_EQ(m.weights, 2 * n);
  EXPECT_DOUBLE_EQ(m.gradients, 6 * n);
  EXPECT_DOUBLE_EQ(m.optimizer, 12 * n);
  l.zero_stage = 1;
  m = EstimateMemory(w, l, k);
  EXPECT_DOUBLE_EQ(m.optimizer, 3 * n);
  EXPECT_DOUBLE_EQ(m.gradients, 6 * n);
  l.zero_stage = 2;
  m = EstimateMemory(w, l, k);
  EXPECT_DOUBLE_EQ(m.gradients, 1.5 * n);
  EXPECT_DOUBLE_EQ(m.weights, 2 * n);
  l.zero_stage = 3;
  m = EstimateMemory(w, l, k);
  EXPECT_DOUBLE_EQ(m.weights, 0.5 * n);
  EXPECT_GT(m.zero3_gathered, 0);
}

TEST(Memory, FallsAsZeroStageRises) {
  // Deep enough that ZeRO-3's two gathered layers weigh less than what it shards.
  Workload w = Tiny(RecipeKind::kBf16Fp32Accum);
  w.model.num_layers = 32;
  w.params = CountParams(w.model);
  Layout l;
  l.dp = 8;
  l.grad_accum = 2;
  double previous = 1e30;
  for (int z = 0; z <= 3; ++z) {
    l.zero_stage = z;
    const double total = EstimateMemory(w, l, Plain()).total();
    EXPECT_LT(total, previous) << "zero stage " << z;
    previous = total;
  }
}

TEST(Memory, PipelineEdgesAndLogits) {
  const Workload w = Tiny();
  Layout l;
  l.pp = 2;
  l.grad_accum = 16;
  l.micro_batch_size = 1;
  const PlannerConstants k = Plain();
  const MemoryBreakdown m = EstimateMemory(w, l, k);
  // Stage 0 holds 2 micro-batches of 2 layers; the last holds 1 micro-batch
  // plus the logits (128 tokens x 256 vocabulary x 4 bytes).
  const double act = ActivationBytesPerLayer(w, l, k);
  const double edge = static_cast<double>(w.params.embedding) * 16;  // fp32: 16 B/param
  const double layers = 2.0 * w.params.per_layer() * 16;
  const double first = layers + edge + 2 * 2 * act;
  const double last = layers + edge + w.params.final_norm * 16.0 + 2 * act + 128.0 * 256 * 4;
  EXPECT_EQ(m.stage, first >= last ? 0 : 1);
  EXPECT_NEAR(m.total() - m.comm_buffers, std::max(first, last), 1.0);
}

TEST(Memory, TensorParallelShardsLinearLayers) {
  const Workload w = Tiny();
  Layout l;
  l.tp = 2;
  l.micro_batch_size = 16;
  const MemoryBreakdown m = EstimateMemory(w, l, Plain());
  const ParamCount& p = w.params;
  const double per_rank = 4 * (p.layer_linear / 2.0 + p.layer_replicated) + p.embedding / 2.0 +
                          p.lm_head / 2.0 + p.final_norm;
  EXPECT_DOUBLE_EQ(m.weights, 4 * per_rank);
}

}  // namespace
// Tiny has 2 KV heads: at tp4 each rank holds one whole KV head (replicated
// over two ranks), so K and V cost 2·h·head_dim per layer, not half of it.
TEST(Memory, ReplicatedKvHeadsCostAWholeHead) {
  const Workload w = Tiny();
  Layout l;
  l.tp = 4;
  l.micro_batch_size = 16;
  const ParamCount& p = w.params;
  const double kv_sharded = p.layer_linear / 4.0;
  const double kv_whole = kv_sharded + 2.0 * 128 * 32 * (1.0 - 2.0 / 4.0);
  const double edges = p.embedding / 4.0 + p.lm_head / 4.0 + p.final_norm;
  EXPECT_DOUBLE_EQ(MaxParamsPerRank(w, l), 4 * (kv_whole + p.layer_replicated) + edges);
  l.tp = 2;  // one KV head per rank: nothing replicated
  EXPECT_DOUBLE_EQ(MaxParamsPerRank(w, l),
                   4 * (p.layer_linear / 2.0 + p.layer_replicated) + p.embedding / 2.0 +
                       p.lm_head / 2.0 + p.final_norm);
}

// The CPU engine's layout of buffers (constants read from its code): per-row
// statistics, SP's gathered GEMM inputs, the working set and scratch.
TEST(Memory, EngineBuffersAddWhatTheyDescribe) {
  const Workload w = Tiny();
  Layout l;
  l.tp = 2;
  l.sequence_parallel = true;
  l.micro_batch_size = 2;  // 256 tokens
  PlannerConstants k = Plain();
  const double base = ActivationBytesPerLayer(w, l, k);
  k.row_stat_bytes = 4;
  // Two norms' 1/rms over 128 rows each, log-sum-exp for 2 local heads.
  EXPECT_DOUBLE_EQ(ActivationBytesPerLayer(w, l, k) - base, 256.0 * (2.0 / 2 + 2) * 4);
  k.row_stat_bytes = 0;
  k.sp_saves_gathered_inputs = true;
  // Two of the four h-wide inputs keep all 256 tokens instead of 128.
  EXPECT_DOUBLE_EQ(ActivationBytesPerLayer(w, l, k) - base, 2.0 * 128 * 128 * 4);
  k = Plain();
  const double before = EstimateMemory(w, l, k).activations;
  k.backward_scratch_layers = 1;
  // dh (128) + 2·q (2·64) + 2·kv (2·32) + 3·f (3·192) per token.
  EXPECT_DOUBLE_EQ(EstimateMemory(w, l, k).activations - before,
                   256.0 * (128 + 128 + 64 + 576) * 4);
}

}  // namespace loom::planner
