// The step-time model. The mesh is pp × dp × ep × cp × tp with tp varying
// fastest: a group crosses nodes when the span of ranks it covers is wider
// than a node.
#include "coordinator/planner/time_model.h"

#include <algorithm>

#include "coordinator/planner/memory_model.h"

namespace loom::planner {

double GemmEfficiency(double tokens, double width, const PlannerConstants& k) {
  const double rows = tokens / (tokens + k.gemm_tokens_half);
  const double cols = width / (width + k.gemm_width_half);
  return std::max(1e-3, k.gemm_peak_efficiency * rows * cols);
}

double CollectiveSeconds(double bytes, int64_t group, double passes, bool inter_node,
                         const ClusterSpec& c, const PlannerConstants& k) {
  if (group <= 1 || bytes <= 0) return 0;
  const double bw = inter_node ? c.inter_node_bandwidth * k.inter_bandwidth_efficiency
                               : c.intra_node_bandwidth * k.intra_bandwidth_efficiency;
  const double g = static_cast<double>(group);
  const double latency = inter_node ? k.inter_latency_s : k.intra_latency_s;
  return passes * ((g - 1) / g * bytes / bw + latency);
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
  const double linear = static_cast<double>(w.params.layer_linear);
  const double layer_flops = (full ? 8.0 : 6.0) * linear + (full || selective ? 16.0 : 12.0) * h * s;
  const double head_flops = 6.0 * m.vocab_size * h;

  const double eff = GemmEfficiency(tokens, h / l.tp, k);
  const double flops_per_sec = peak * eff;

  // Per micro-batch on each end stage: compute plus the collectives inside it.
  const double tp_bytes = tokens * h * e;
  const bool tp_inter = l.tp > node;
  const double tp_per_layer =
      (full ? 6.0 : 4.0) * CollectiveSeconds(tp_bytes, l.tp, 2.0, tp_inter, c, k);
  const double kv_bytes = static_cast<double>(l.micro_batch_size) * s * 2.0 * m.kv_dim() / l.tp * e;
  const bool cp_inter = l.tp * l.cp > node;
  // Forward all-gathers K and V; backward gathers them again and
  // reduce-scatters their gradients.
  const double cp_per_layer = (full ? 4.0 : 3.0) * CollectiveSeconds(kv_bytes, l.cp, 1.0, cp_inter, c, k);

  double stage_compute = 0, stage_tp = 0, stage_cp = 0;
  for (int64_t stage : {int64_t{0}, l.pp - 1}) {
    const int64_t layers = LayersOnStage(m.num_layers, l.pp, stage);
    double flops = layers * tokens * layer_flops / l.tp;
    if (stage == l.pp - 1) flops += tokens * head_flops / l.tp;
    const double compute = flops / flops_per_sec + layers * k.layer_overhead_s;
    const double tp = layers * tp_per_layer * (1.0 - k.tp_overlap);
    const double cp = layers * cp_per_layer * (1.0 - k.tp_overlap);
    if (compute + tp + cp > stage_compute + stage_tp + stage_cp) {
      stage_compute = compute;
      stage_tp = tp;
      stage_cp = cp;
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
    p2p = 2.0 * v * (bytes / bw + k.p2p_latency_s);
  }
  const double per_mb = stage_compute + stage_tp + stage_cp + p2p;
  const double gas = static_cast<double>(l.grad_accum);

  StepTime t;
  t.compute = gas * stage_compute;
  t.tp_comm = gas * stage_tp;
  t.cp_comm = gas * stage_cp;
  t.pp_comm = gas * p2p;
  t.bubble = l.pp > 1 ? (l.pp - 1) / v * per_mb : 0;

  // Data parallelism: gradients reduce over DP×CP once per step, hidden
  // behind part of the last micro-batch's backward. With ZeRO the reduction
  // is a reduce-scatter and the updated weights are all-gathered after the
  // optimizer step, where nothing hides them. ZeRO-3 gathers weights for
  // every micro-batch's forward and backward, hidden behind compute.
  const double params = MaxParamsPerRank(w, l);
  const int64_t group = l.dp * l.cp;
  const bool dp_inter = l.dp * l.ep * l.cp * l.tp > node;
  const double grad_bytes = params * r.grad_reduce_bytes;
  const double backward_last = stage_compute * 2.0 / 3.0;
  double dp = 0;
  if (l.zero_stage == 0) {
    const double reduce = CollectiveSeconds(grad_bytes, group, 2.0, dp_inter, c, k);
    dp = std::max(0.0, reduce - k.dp_overlap * backward_last);
  } else {
    const double reduce = CollectiveSeconds(grad_bytes, group, 1.0, dp_inter, c, k);
    dp = std::max(0.0, reduce - k.dp_overlap * backward_last);
    if (l.zero_stage < 3) dp += CollectiveSeconds(params * r.weight_bytes, group, 1.0, dp_inter, c, k);
  }
  if (l.zero_stage >= 3) {
    const double gather = 2.0 * CollectiveSeconds(params * r.weight_bytes, group, 1.0, dp_inter, c, k);
    dp += gas * std::max(0.0, gather - k.dp_overlap * stage_compute);
  }
  t.dp_comm = dp;

  // The optimizer reads gradients, master weights and moments, writes them
  // back with the new weights: memory-bound.
  const double opt_shard = l.zero_stage >= 1 ? static_cast<double>(group) : 1.0;
  const double touched = r.grad_bytes + r.grad_accum_bytes + r.weight_bytes +
                         2.0 * (r.master_bytes + r.optimizer_bytes);
  t.optimizer = params / opt_shard * touched / c.hbm_bandwidth;

  t.total = t.compute + t.tp_comm + t.cp_comm + t.pp_comm + t.bubble + t.dp_comm + t.optimizer;
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
