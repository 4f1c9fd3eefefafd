// The step-time model. The mesh is pp × dp × ep × cp × tp with tp varying
// fastest: a group crosses nodes when the span of ranks it covers is wider
// than a node.
#include "planner/time_model.h"

#include <algorithm>
#include <vector>

#include "planner/memory_model.h"

namespace loom::planner {

double GemmEfficiency(double tokens, double width, const PlannerConstants& k) {
  const double rows = tokens / (tokens + k.gemm_tokens_half);
  const double cols = width / (width + k.gemm_width_half);
  return std::max(1e-3, k.gemm_peak_efficiency * rows * cols);
}

int64_t GroupRanksPerNode(int64_t size, int64_t stride, int64_t devices_per_node) {
  return std::clamp<int64_t>(devices_per_node / std::max<int64_t>(1, stride), 1, std::max<int64_t>(1, size));
}

double CollectiveSeconds(double bytes, int64_t group, double passes, int64_t ranks_per_node,
                         const ClusterSpec& c, const PlannerConstants& k) {
  if (group <= 1 || bytes <= 0) return 0;
  const int64_t per_node = std::clamp<int64_t>(ranks_per_node, 1, group);
  const int64_t nodes = (group + per_node - 1) / per_node;
  const double nvlink = c.intra_node_bandwidth * k.intra_bandwidth_efficiency;
  double bw = nvlink;
  if (nodes > 1) {
    // The group's ranks on a node own per_node NIC shares; NCCL's rail-aligned
    // rings spread its traffic over all of them (nic_spread 1), or a stack
    // that does not keeps it on one share (0).
    const double nics = 1.0 + k.nic_spread * static_cast<double>(per_node - 1);
    bw = std::min(nvlink, c.inter_node_bandwidth * k.inter_bandwidth_efficiency * nics);
  }
  const double g = static_cast<double>(group);
  const double inter_steps = static_cast<double>(nodes - 1);
  const double intra_steps = g - 1 - inter_steps;
  return k.collective_launch_s +
         passes * ((g - 1) / g * bytes / bw + intra_steps * k.intra_latency_s +
                   inter_steps * k.inter_latency_s);
}

CpRingBytes CpRingBytesPerLayer(double kv_bytes, int64_t cp) {
  if (cp <= 1) return {};
  const double block = kv_bytes / static_cast<double>(cp);
  return {static_cast<double>(cp - 1) * block, static_cast<double>(2 * cp - 1) * block};
}

StepTime EstimateStepTime(const Workload& w, const Layout& l, const ClusterSpec& c,
                          const PlannerConstants& k) {
  const ModelShape& m = w.model;
  const PrecisionRecipe& r = Recipe(w.recipe);
  const double peak = c.PeakFlops(r.compute);
  const double s = static_cast<double>(w.seq_len);
  const double h = static_cast<double>(m.hidden_size);
  const double tokens = static_cast<double>(l.micro_batch_size) * s / l.cp;  // per rank
  const double e = r.activation_bytes;
  const int64_t node = c.devices_per_node;

  // Hardware FLOPs per token of one layer and of the LM head.
  const bool full = l.recompute == spec::Recompute::kFull;
  const bool selective = l.recompute == spec::Recompute::kSelective;
  // [moe] A token runs top_k of the E routed experts of a layer.
  const double active_experts =
      m.num_experts > 0 && m.num_layers > 0
          ? static_cast<double>(w.params.experts) / m.num_layers * m.top_k / m.num_experts
          : 0.0;
  const double linear = static_cast<double>(w.params.layer_linear) + active_experts;
  const double layer_flops = (full ? 8.0 : 6.0) * linear + (full || selective ? 16.0 : 12.0) * h * s;
  const double head_flops = 6.0 * m.vocab_size * h;

  const double eff = GemmEfficiency(tokens, h / l.tp, k);
  const double flops_per_sec = peak * eff;

  // Per micro-batch on each end stage: compute plus the collectives inside it.
  const double tp_bytes = tokens * h * e;
  const int64_t tp_per_node = GroupRanksPerNode(l.tp, 1, node);
  const double tp_per_layer =
      (full ? 6.0 : 4.0) * CollectiveSeconds(tp_bytes, l.tp, 2.0, tp_per_node, c, k);
  const double kv_bytes = static_cast<double>(l.micro_batch_size) * s * 2.0 * m.kv_dim() / l.tp * e;
  const int64_t cp_per_node = GroupRanksPerNode(l.cp, l.tp, node);
  // The ring (CpRingBytesPerLayer): cp - 1 K/V blocks forward (again under
  // full recompute), 2 cp - 1 blocks backward; in passes of an all-gather
  // of kv_bytes, which moves (cp - 1) / cp of it.
  double cp_per_layer = 0;
  if (l.cp > 1) {
    const CpRingBytes ring = CpRingBytesPerLayer(kv_bytes, l.cp);
    const double pass = kv_bytes * static_cast<double>(l.cp - 1) / static_cast<double>(l.cp);
    const double passes = ((full ? 2.0 : 1.0) * ring.forward + ring.backward) / pass;
    cp_per_layer = CollectiveSeconds(kv_bytes, l.cp, passes, cp_per_node, c, k);
  }
  // [moe] Expert parallelism: each MoE layer sends every token's top_k rows
  // to the experts' ranks and back (dispatch and combine) in the forward, the
  // gradients the same way in the backward, and again in a full recompute;
  // an all-to-all moves (ep-1)/ep of its buffer, as a ring pass does. The ep
  // ranks sit cp·tp apart in the mesh. Averaged over the layers.
  const double moe_share =
      m.num_layers > 0 ? static_cast<double>(m.moe_layers()) / m.num_layers : 0.0;
  const double a2a_bytes = tokens * m.top_k * h * e;
  const int64_t ep_per_node = GroupRanksPerNode(l.ep, l.cp * l.tp, node);
  const double ep_per_layer = moe_share * (full ? 6.0 : 4.0) *
                              CollectiveSeconds(a2a_bytes, l.ep, 1.0, ep_per_node, c, k);

  // Unfused attention streams every score through HBM: per score, forward
  // writes it (baddbmm), reads and writes it (scale, mask, softmax), reads and
  // writes it with a one-byte mask (dropout) and reads it (the value GEMM):
  // 6 elements + 1 byte; backward moves 9 elements + 1 byte. A recompute
  // repeats the forward.
  const double heads_per_rank = static_cast<double>(m.num_heads) / l.tp;
  const double scores = m.fused_attention
                            ? 0.0
                            : static_cast<double>(l.micro_batch_size) * heads_per_rank * s * s / l.cp;
  const double score_traffic = (full || selective ? 2.0 : 1.0) * (6.0 * e + 1.0) + 9.0 * e + 1.0;
  // The element-wise work around the GEMMs is bound by HBM bandwidth. Per
  // token, the forward reads and writes: two norms (4h) and two residual
  // adds (6h) over the hidden state, which SP shards; the MLP activation
  // (SwiGLU reads 2f, writes f; GELU reads and writes f) and the re-layout of
  // Q and K (rotary, or the head transpose) over the TP-sharded widths. The
  // backward moves about twice the forward; a recompute repeats the forward.
  const double f = m.ActiveFfnWidth();
  const double kv = static_cast<double>(m.kv_dim());
  const double hidden_elems = 10.0 * h / (l.sequence_parallel ? l.tp : 1);
  const double sharded_elems = ((m.gated_mlp ? 3.0 : 2.0) * f + 2.0 * (h + kv)) / l.tp;
  const double passes = full ? 4.0 : 3.0;
  const double elementwise_bytes = tokens * (hidden_elems + sharded_elems) * e * passes;
  const double layer_memory_s = (scores * score_traffic + elementwise_bytes) / c.hbm_bandwidth;
  // The host's work per layer: a forward and a backward, and the repeated
  // forward of full recompute.
  const double host_per_layer = k.layer_overhead_s * (full ? 4.0 / 3.0 : 1.0);

  double stage_compute = 0, stage_tp = 0, stage_cp = 0, stage_ep = 0;
  for (int64_t stage : {int64_t{0}, l.pp - 1}) {
    const int64_t layers = LayersOnStage(m.num_layers, l.pp, stage);
    double flops = layers * tokens * layer_flops / l.tp;
    if (stage == l.pp - 1) flops += tokens * head_flops / l.tp;
    const double device = flops / flops_per_sec + layers * layer_memory_s;
    const double host = layers * host_per_layer;
    const double compute = device + host - k.host_overlap * std::min(device, host);
    const double tp = layers * tp_per_layer * (1.0 - k.tp_overlap);
    const double cp = layers * cp_per_layer * (1.0 - k.tp_overlap);
    const double ep = layers * ep_per_layer;  // on the critical path: the experts wait for it
    if (compute + tp + cp + ep > stage_compute + stage_tp + stage_cp + stage_ep) {
      stage_compute = compute;
      stage_tp = tp;
      stage_cp = cp;
      stage_ep = ep;
    }
  }

  const double v = l.schedule == spec::Schedule::kInterleaved ? l.virtual_stages : 1;
  double p2p = 0;
  if (l.pp > 1) {
    const bool pp_inter = l.dp * l.ep * l.cp * l.tp >= node;
    const double bytes = tokens * h / (l.sequence_parallel ? l.tp : 1) * e;
    // One activation forward and one gradient backward per micro-batch and chunk.
    const double bw = pp_inter ? c.inter_node_bandwidth * k.inter_bandwidth_efficiency
                               : c.intra_node_bandwidth * k.intra_bandwidth_efficiency;
    // NCCL's send/recv pays the call's fixed cost and one link step; the
    // framework may add its own (p2p_latency_s: handshakes, stalls).
    const double step = pp_inter ? k.inter_latency_s : k.intra_latency_s;
    p2p = 2.0 * v * (bytes / bw + k.collective_launch_s + step + k.p2p_latency_s);
  }
  const double per_mb = stage_compute + stage_tp + stage_cp + stage_ep + p2p;
  const double gas = static_cast<double>(l.grad_accum);

  StepTime t;
  t.compute = gas * stage_compute;
  t.tp_comm = gas * stage_tp;
  t.cp_comm = gas * stage_cp;
  t.ep_comm = gas * stage_ep;
  t.pp_comm = gas * p2p;
  t.bubble = l.pp > 1 ? (l.pp - 1) / v * per_mb : 0;

  // Data parallelism: gradients reduce over DP×CP once per step, hidden
  // behind part of the last micro-batch's backward. ZeRO-3 gathers weights
  // for every micro-batch's forward and backward, hidden behind compute.
  const double params = MaxParamsPerRank(w, l);
  // Gradients reduce over the ranks that hold the same weights with other
  // data: DP×CP, and for the dense weights of an MoE under expert
  // parallelism DP×EP×CP, the routed experts staying in DP×CP (docs/moe.md).
  // The DP×CP group: cp ranks tp apart, then dp ranks ep·cp·tp apart; the
  // DP×EP×CP group: ep·cp ranks tp apart, then dp ranks ep·cp·tp apart.
  struct ReduceGroup {
    double params;
    int64_t size;
    int64_t per_node;
  };
  auto group_of = [&](int64_t inner) {
    const int64_t inner_on_node = GroupRanksPerNode(inner, l.tp, node);
    const int64_t dp_on_node =
        inner_on_node < inner ? 1 : GroupRanksPerNode(l.dp, l.ep * l.cp * l.tp, node);
    return std::pair<int64_t, int64_t>{l.dp * inner, inner_on_node * dp_on_node};
  };
  const auto [group, dp_per_node] = group_of(l.cp);
  std::vector<ReduceGroup> groups = {{params, group, dp_per_node}};
  if (l.ep > 1) {
    const double experts =
        ExpertParamsPerLayer(w, l) * static_cast<double>(LayersOnStage(m.num_layers, l.pp, 0));
    const auto [dense_group, dense_per_node] = group_of(l.ep * l.cp);
    groups = {{params - experts, dense_group, dense_per_node}, {experts, group, dp_per_node}};
  }
  // Seconds of one collective per group on bytes_per_param of its params / parts.
  auto over_groups = [&](double bytes_per_param, double passes, double parts) {
    double seconds = 0;
    for (const ReduceGroup& g : groups) {
      seconds += parts * CollectiveSeconds(g.params * bytes_per_param / parts, g.size, passes,
                                           g.per_node, c, k);
    }
    return seconds;
  };
  const double backward_last = stage_compute * 2.0 / 3.0;
  // ZeRO-0, and ZeRO-1 in frameworks that keep DDP's all-reduce, reduce the
  // whole gradient once per step, after the last backward; ZeRO-1 with a
  // reduce-scatter likewise. ZeRO-2/3 keep only their gradient shard, so they
  // reduce-scatter every micro-batch's gradients, layer by layer, behind that
  // micro-batch's backward.
  const double stage_layers = static_cast<double>(LayersOnStage(m.num_layers, l.pp, 0));
  double dp = 0;
  if (l.zero_stage <= 1) {
    const bool all_reduce = l.zero_stage == 0 || !k.zero1_reduce_scatter;
    const double reduce = over_groups(r.grad_reduce_bytes, all_reduce ? 2.0 : 1.0, 1.0);
    dp = std::max(0.0, reduce - k.dp_overlap * backward_last);
  } else {
    const double reduce = over_groups(r.grad_reduce_bytes, 1.0, stage_layers);
    dp = gas * std::max(0.0, reduce - k.dp_overlap * backward_last);
  }
  // ZeRO-1/2: the updated weight shards are all-gathered after the optimizer
  // step, where nothing hides them.
  if (l.zero_stage == 1 || l.zero_stage == 2) {
    dp += over_groups(r.weight_bytes, 1.0, 1.0);
  }
  // ZeRO-3 gathers each layer's weights for every micro-batch's forward and
  // again for its backward.
  if (l.zero_stage >= 3) {
    const double gather = 2.0 * over_groups(r.weight_bytes, 1.0, stage_layers);
    dp += gas * std::max(0.0, gather - k.dp_overlap * stage_compute);
  }
  t.dp_comm = dp;

  // The optimizer reads gradients, master weights and moments, writes them
  // back with the new weights: memory-bound.
  double sharded_params = 0;
  for (const ReduceGroup& g : groups) {
    sharded_params += g.params / (l.zero_stage >= 1 ? static_cast<double>(g.size) : 1.0);
  }
  const double touched = r.grad_bytes + r.grad_accum_bytes + r.weight_bytes +
                         2.0 * (r.master_bytes + r.optimizer_bytes);
  t.optimizer = sharded_params * touched / c.hbm_bandwidth;

  t.total = t.compute + t.tp_comm + t.cp_comm + t.ep_comm + t.pp_comm + t.bubble + t.dp_comm +
            t.optimizer;
  t.bubble_fraction = t.bubble / t.total;
  const double step_tokens = static_cast<double>(w.global_batch) * s;
  t.tokens_per_second = step_tokens / t.total;
  t.tokens_per_second_per_device = t.tokens_per_second / l.world();
  const double device_flops = peak * l.world();
  t.mfu = ModelFlopsPerToken(m, w.seq_len) * t.tokens_per_second / device_flops;
  t.hfu = HardwareFlopsPerToken(m, w.seq_len, l.recompute) * t.tokens_per_second / device_flops;
  return t;
}

}  // namespace loom::planner
