// The step-time model: pure compute matches FLOPs over peak, the 1F1B bubble
// is (p-1)/(m+p-1), communication lands on the right link, MFU agrees with
// its definition.
#include "planner/time_model.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace loom::planner {
namespace {

Workload Model() {
  ModelShape m;
  m.vocab_size = 32000;
  m.hidden_size = 4096;
  m.num_layers = 32;
  m.num_heads = 32;
  m.num_kv_heads = 8;
  m.ffn_hidden_size = 14336;
  return MakeWorkload(m, 4096, 64, RecipeKind::kBf16Fp32Accum);
}

ClusterSpec Cluster(int64_t nodes) {
  ClusterSpec c = *ClusterPreset("h100-sxm");
  c.nodes = nodes;
  return c;
}

// Ideal hardware: full efficiency, no overheads; infinite links.
PlannerConstants Ideal() {
  PlannerConstants k;
  k.gemm_peak_efficiency = 1;
  k.gemm_tokens_half = 0;
  k.gemm_width_half = 0;
  k.layer_overhead_s = 0;
  k.intra_latency_s = k.inter_latency_s = k.p2p_latency_s = k.collective_launch_s = 0;
  k.intra_bandwidth_efficiency = k.inter_bandwidth_efficiency = 1e12;
  return k;
}

TEST(StepTime, ComputeIsFlopsOverPeak) {
  const Workload w = Model();
  const ClusterSpec c = Cluster(1);
  Layout l;
  l.dp = 8;
  l.micro_batch_size = 2;
  l.grad_accum = 4;
  const StepTime t = EstimateStepTime(w, l, c, Ideal());
  const double layer = 6.0 * w.params.layer_linear + 12.0 * 4096 * 4096;
  const double per_token = 32 * layer + 6.0 * 32000 * 4096;
  const double tokens_per_rank = 64.0 * 4096 / 8;
  // Element-wise traffic per token and layer, forward: norms and residuals
  // 10h, SwiGLU 3f, Q/K re-layout 2(h + kv); backward twice; bf16.
  const double elementwise = (10.0 * 4096 + 3.0 * 14336 + 2.0 * (4096 + 1024)) * 2.0 * 3.0;
  EXPECT_NEAR(t.compute,
              tokens_per_rank * (per_token / 989.5e12 + 32 * elementwise / c.hbm_bandwidth), 1e-9);
  EXPECT_NEAR(t.tp_comm + t.pp_comm + t.bubble + t.cp_comm, 0, 1e-12);
  // MFU by its definition.
  EXPECT_NEAR(t.mfu, ModelFlopsPerToken(w.model, 4096) * t.tokens_per_second / (8 * 989.5e12), 1e-12);
}

TEST(StepTime, OneFOneBBubble) {
  const Workload w = Model();
  Layout l;
  l.dp = 2;
  l.pp = 4;
  l.micro_batch_size = 1;
  l.grad_accum = 32;
  const StepTime t = EstimateStepTime(w, l, Cluster(1), Ideal());
  const double per_mb = t.compute / 32;
  EXPECT_NEAR(t.bubble, 3 * per_mb, 1e-9);
  l.schedule = spec::Schedule::kInterleaved;
  l.virtual_stages = 2;
  EXPECT_NEAR(EstimateStepTime(w, l, Cluster(1), Ideal()).bubble, 1.5 * per_mb, 1e-9);
}

TEST(StepTime, FullRecomputeCostsAForwardPass) {
  const Workload w = Model();
  Layout l;
  l.dp = 8;
  l.micro_batch_size = 1;
  l.grad_accum = 8;
  const double none = EstimateStepTime(w, l, Cluster(1), Ideal()).compute;
  l.recompute = spec::Recompute::kFull;
  const StepTime full = EstimateStepTime(w, l, Cluster(1), Ideal());
  EXPECT_GT(full.compute, none * 1.25);
  EXPECT_LT(full.compute, none * 1.34);
  EXPECT_GT(full.hfu, full.mfu);
}

TEST(Collectives, RingVolumesAndLinks) {
  const ClusterSpec c = Cluster(2);
  PlannerConstants k;
  k.intra_bandwidth_efficiency = k.inter_bandwidth_efficiency = 1;
  k.intra_latency_s = k.inter_latency_s = k.collective_launch_s = 0;
  k.nic_spread = 0;
  // All-reduce of 1 GB over 8 ranks: 2 * 7/8 GB at 450 GB/s inside a node.
  EXPECT_NEAR(CollectiveSeconds(1e9, 8, 2.0, 8, c, k), 2 * 0.875 / 450, 1e-12);
  // One rank per node: each on its own 50 GB/s NIC share.
  EXPECT_NEAR(CollectiveSeconds(1e9, 8, 2.0, 1, c, k), 2 * 0.875 / 50, 1e-12);
  EXPECT_EQ(CollectiveSeconds(1e9, 1, 2.0, 1, c, k), 0);
  // 16 ranks, 8 per node: with nic_spread 0 the ring still runs at one NIC
  // share; with 1 the group's 8 ranks drive 8 shares (400 GB/s), NVLink
  // (450) no longer the limit.
  EXPECT_NEAR(CollectiveSeconds(1e9, 16, 2.0, 8, c, k), 2 * (15.0 / 16) / 50, 1e-12);
  k.nic_spread = 1;
  EXPECT_NEAR(CollectiveSeconds(1e9, 16, 2.0, 8, c, k), 2 * (15.0 / 16) / 400, 1e-12);
  EXPECT_NEAR(CollectiveSeconds(1e9, 16, 2.0, 2, c, k), 2 * (15.0 / 16) / 100, 1e-12);
}

TEST(Collectives, GroupRanksPerNode) {
  EXPECT_EQ(GroupRanksPerNode(4, 1, 8), 4);    // TP 4 inside a node
  EXPECT_EQ(GroupRanksPerNode(16, 1, 8), 8);   // TP 16 spans two nodes
  EXPECT_EQ(GroupRanksPerNode(64, 2, 8), 4);   // DP 64 behind TP 2
  EXPECT_EQ(GroupRanksPerNode(64, 8, 8), 1);   // DP behind TP 8: one per node
  EXPECT_EQ(GroupRanksPerNode(2, 16, 8), 1);
}

TEST(StepTime, TensorParallelAcrossNodesIsSlower) {
  const Workload w = Model();
  PlannerConstants k = DefaultConstants();
  Layout inside;
  inside.dp = 2;
  inside.tp = 8;
  inside.micro_batch_size = 1;
  inside.grad_accum = 32;
  inside.sequence_parallel = true;
  Layout across = inside;
  across.dp = 1;
  across.tp = 16;
  across.grad_accum = 64;
  const StepTime a = EstimateStepTime(w, inside, Cluster(2), k);
  const StepTime b = EstimateStepTime(w, across, Cluster(2), k);
  EXPECT_GT(b.tp_comm, 2 * a.tp_comm);
}

TEST(StepTime, UnfusedAttentionStreamsScoresThroughMemory) {
  Workload w = Model();
  Layout l;
  l.dp = 8;
  l.micro_batch_size = 1;
  l.grad_accum = 8;
  const double fused = EstimateStepTime(w, l, Cluster(1), Ideal()).compute;
  w.model.fused_attention = false;
  const double unfused = EstimateStepTime(w, l, Cluster(1), Ideal()).compute;
  // 32 heads x 4096^2 scores per layer and micro-batch; forward 6 bf16
  // elements + 1 mask byte each, backward 9 + 1.
  const double scores = 32.0 * 4096 * 4096;
  EXPECT_NEAR(unfused - fused, 8 * 32 * scores * (13.0 + 19.0) / Cluster(1).hbm_bandwidth, 1e-9);
}

TEST(StepTime, HostWorkAddsOrHidesBehindTheDevice) {
  const Workload w = Model();
  Layout l;
  l.dp = 8;
  l.micro_batch_size = 1;
  l.grad_accum = 8;
  PlannerConstants k = Ideal();
  const double device = EstimateStepTime(w, l, Cluster(1), k).compute;
  k.layer_overhead_s = 1e-3;
  k.host_overlap = 0;
  EXPECT_NEAR(EstimateStepTime(w, l, Cluster(1), k).compute, device + 8 * 32 * 1e-3, 1e-9);
  k.host_overlap = 1;  // the larger of host and device work
  EXPECT_NEAR(EstimateStepTime(w, l, Cluster(1), k).compute, std::max(device, 8 * 32 * 1e-3), 1e-9);
  k.layer_overhead_s = 1.0;
  EXPECT_NEAR(EstimateStepTime(w, l, Cluster(1), k).compute, 8 * 32 * 1.0, 1e-9);
}

TEST(StepTime, ZeroOneReductionFollowsTheFramework) {
  const Workload w = Model();
  Layout l;
  l.dp = 16;
  l.micro_batch_size = 1;
  l.grad_accum = 4;
  PlannerConstants k = Ideal();
  k.intra_bandwidth_efficiency = k.inter_bandwidth_efficiency = 1;
  k.dp_overlap = 0;
  const double zero0 = EstimateStepTime(w, l, Cluster(2), k).dp_comm;
  // ZeRO-0: an all-reduce of fp32 gradients, 2 x 15/16 of the buffer.
  const double params = static_cast<double>(w.params.total);
  // Two nodes, 8 of the group's ranks on each: they drive 8 NIC shares
  // (NCCL's rail-aligned rings), 400 GB/s, below NVLink's 450.
  const double bw = 8 * Cluster(2).inter_node_bandwidth;
  EXPECT_NEAR(zero0, 2.0 * 15.0 / 16.0 * params * 4 / bw, 1e-6);
  const double gather = 15.0 / 16.0 * params * 2 / bw;  // bf16 weights
  l.zero_stage = 1;
  k.zero1_reduce_scatter = true;  // reduce-scatter, then all-gather
  EXPECT_NEAR(EstimateStepTime(w, l, Cluster(2), k).dp_comm, zero0 / 2 + gather, 1e-6);
  k.zero1_reduce_scatter = false;  // nanotron: DDP's all-reduce, then all-gather
  EXPECT_NEAR(EstimateStepTime(w, l, Cluster(2), k).dp_comm, zero0 + gather, 1e-6);
}

TEST(Collectives, LatencyIsPaidPerRingStep) {
  const ClusterSpec c = Cluster(1);
  PlannerConstants k;
  k.intra_bandwidth_efficiency = 1;
  k.intra_latency_s = 1e-5;
  k.inter_latency_s = 1e-4;
  k.collective_launch_s = 3e-5;
  EXPECT_NEAR(CollectiveSeconds(0.0 + 1e-300, 8, 2.0, 8, c, k), 3e-5 + 2 * 7 * 1e-5, 1e-12);
  EXPECT_NEAR(CollectiveSeconds(0.0 + 1e-300, 2, 1.0, 8, c, k), 3e-5 + 1e-5, 1e-12);
  // 32 ranks on 4 nodes: per pass 3 steps cross the network, 28 stay on NVLink.
  EXPECT_NEAR(CollectiveSeconds(0.0 + 1e-300, 32, 2.0, 8, c, k), 3e-5 + 2 * (28 * 1e-5 + 3 * 1e-4),
              1e-12);
}

// The profiles share compute and differ in framework costs; Megatron keeps
// nanotron's memory fit, Loom's engine its own layout on every backend.
TEST(Profiles, MegatronAndLoomKeepComputeAndUseNcclLinks) {
  const PlannerConstants n = NanotronConstants();
  EXPECT_EQ(MegatronConstants(n).activation_factor, n.activation_factor);
  for (const PlannerConstants& loom : {LoomEngineConstants(n), DefaultConstants()}) {
    EXPECT_EQ(loom.activation_factor, CpuEngineConstants().activation_factor);
    EXPECT_EQ(loom.logits_bytes_per_element, CpuEngineConstants().logits_bytes_per_element);
    EXPECT_EQ(loom.memory_overhead_bytes, n.memory_overhead_bytes);  // the CUDA context's
  }
  for (const PlannerConstants& k : {MegatronConstants(n), LoomEngineConstants(n), DefaultConstants()}) {
    EXPECT_EQ(k.gemm_peak_efficiency, n.gemm_peak_efficiency);
    EXPECT_EQ(k.layer_overhead_s, n.layer_overhead_s);
    EXPECT_EQ(k.collective_launch_s, WithNcclLinks(n).collective_launch_s);
    EXPECT_LT(k.intra_latency_s, n.intra_latency_s);  // NCCL's step, not nanotron's
    EXPECT_EQ(k.p2p_latency_s, 0);
    EXPECT_TRUE(k.zero1_reduce_scatter);
  }
  EXPECT_EQ(MegatronConstants(n).dp_overlap, 0);  // no DDP gradient bucketing in vTrain's runs
  EXPECT_EQ(LoomEngineConstants(n).dp_overlap, n.dp_overlap);
}

TEST(Gemm, EfficiencyGrowsWithShape) {
  const PlannerConstants k = DefaultConstants();
  EXPECT_LT(GemmEfficiency(1024, 512, k), GemmEfficiency(8192, 512, k));
  EXPECT_LE(GemmEfficiency(1024, 128, k), GemmEfficiency(1024, 4096, k));
  EXPECT_LE(GemmEfficiency(1e9, 1e9, k), k.gemm_peak_efficiency + 1e-12);
}

}  // namespace
}  // namespace loom::planner
