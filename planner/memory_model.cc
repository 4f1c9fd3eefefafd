// The per-rank memory model. Element counts are per token per layer, in the
// units of Korthikanti et al.'s table 2: with fused attention no s×s score
// matrix is saved; SwiGLU saves gate, up and their product; GQA shrinks the
// saved K and V to kv_heads·head_dim.
#include "planner/memory_model.h"

#include <algorithm>

namespace loom::planner {
namespace {

double CeilDiv(double a, double b) { return (a + b - 1) / b; }

struct StageParams {
  double layer_params = 0;  // per rank, this stage's layers (routed experts included)
  double expert_params = 0;  // [moe] the routed experts' share of layer_params
  double edge_params = 0;   // embedding / LM head / norms on this rank
  double lm_head_rows = 0;  // vocabulary rows this rank's LM head computes
};

StageParams ParamsOnStage(const Workload& w, const Layout& l, int64_t stage) {
  const ParamCount& p = w.params;
  StageParams s;
  const int64_t layers = LayersOnStage(w.model.num_layers, l.pp, stage);
  // KV heads fewer than tp ranks are replicated, one per rank: K and V then
  // cost each rank a whole head's projection.
  const ModelShape& m = w.model;
  const double kv_share = static_cast<double>(m.num_kv_heads) / l.tp;
  const double kv_replicated =
      kv_share < 1.0 ? 2.0 * m.hidden_size * m.head_dim() * (1.0 - kv_share) : 0.0;
  s.layer_params =
      layers * (static_cast<double>(p.layer_linear) / l.tp + kv_replicated + p.layer_replicated);
  // [moe] The routed experts, averaged over the layers, split over ep x tp.
  s.expert_params = layers * ExpertParamsPerLayer(w, l);
  s.layer_params += s.expert_params;
  const bool first = stage == 0;
  const bool last = stage == l.pp - 1;
  if (first) s.edge_params += static_cast<double>(p.embedding) / l.tp + p.position_embedding;
  if (last) {
    // A tied embedding is still needed on the last stage to compute logits.
    const double head = p.lm_head > 0 ? p.lm_head : (first ? 0.0 : p.embedding);
    s.edge_params += head / l.tp + p.final_norm;
    s.lm_head_rows = static_cast<double>(w.model.vocab_size) / l.tp;
  }
  return s;
}

}  // namespace

double ExpertParamsPerLayer(const Workload& w, const Layout& l) {
  if (w.model.num_layers <= 0) return 0;
  return static_cast<double>(w.params.experts) / w.model.num_layers / (l.ep * l.tp);
}

int64_t LayersOnStage(int64_t num_layers, int64_t pp, int64_t stage) {
  const int64_t base = num_layers / pp;
  return base + (stage < num_layers % pp ? 1 : 0);
}

double MaxParamsPerRank(const Workload& w, const Layout& l) {
  double best = 0;
  for (int64_t stage : {int64_t{0}, l.pp - 1}) {
    const StageParams sp = ParamsOnStage(w, l, stage);
    best = std::max(best, sp.layer_params + sp.edge_params);
  }
  return best;
}

double ActivationBytesPerLayer(const Workload& w, const Layout& l, const PlannerConstants& k) {
  const ModelShape& m = w.model;
  const double tokens = static_cast<double>(l.micro_batch_size) * w.seq_len / l.cp;
  const double e = Recipe(w.recipe).activation_bytes;
  const double h = static_cast<double>(m.hidden_size);
  const double sp_div = l.sequence_parallel ? l.tp : 1;
  if (l.recompute == spec::Recompute::kFull) {
    // Only each layer's input survives the forward pass.
    return tokens * h / sp_div * e;
  }
  // Inputs of the two norms and of the QKV and first MLP GEMMs: replicated
  // across TP unless sequence parallelism shards them (a framework may keep
  // the GEMM inputs as gathered, all tokens).
  const double replicated =
      k.sp_saves_gathered_inputs ? 2.0 * h / sp_div + 2.0 * h : 4.0 * h / sp_div;
  // Q, K, V and the attention output, sharded by heads.
  // KV heads that do not divide by tp are replicated, one head per rank.
  const double kv_local = std::max(1.0, static_cast<double>(m.num_kv_heads) / l.tp) * m.head_dim();
  const double attention = 2.0 * m.num_heads * m.head_dim() / static_cast<double>(l.tp) + 2.0 * kv_local;
  // SwiGLU: gate and up outputs and their product; GELU: pre- and post-activation.
  const double mlp = (m.gated_mlp ? 3.0 : 2.0) * m.ActiveFfnWidth() / static_cast<double>(l.tp);
  double bytes = tokens * (replicated + attention + mlp) * e;
  // Per-row statistics: two norms' 1/rms (rows sharded by SP), and the
  // attention's log-sum-exp per local head.
  bytes += tokens * (2.0 / sp_div + static_cast<double>(m.num_heads) / l.tp) * k.row_stat_bytes;
  if (l.recompute == spec::Recompute::kNone && k.attention_score_bytes > 0) {
    // Unfused attention keeps its softmax output: heads/tp × s_q × s_kv per sequence.
    bytes += tokens * (static_cast<double>(m.num_heads) / l.tp) * w.seq_len * k.attention_score_bytes;
  }
  return bytes;
}

double MicroBatchesInFlight(const Layout& l, int64_t stage) {
  const double m = static_cast<double>(l.grad_accum);
  if (l.pp == 1) return 1;
  switch (l.schedule) {
    case spec::Schedule::kAfab:
      return m;
    case spec::Schedule::k1F1B:
      return std::min(m, static_cast<double>(l.pp - stage));
    case spec::Schedule::kInterleaved: {
      // Narayanan et al.: the warm-up of the interleaved schedule holds
      // (1 + (p-1)/(p·v)) times what 1F1B holds.
      const double p = static_cast<double>(l.pp);
      const double v = static_cast<double>(l.virtual_stages);
      const double base = std::min(m, p - stage);
      return std::min(m, base * (1.0 + (p - 1.0) / (p * v)));
    }
  }
  return 1;
}

MemoryBreakdown EstimateStageMemory(const Workload& w, const Layout& l, const PlannerConstants& k,
                                    int64_t stage) {
  const PrecisionRecipe& r = Recipe(w.recipe);
  // ZeRO shards dense weights over DP×EP×CP (every rank with other data),
  // the routed experts over DP×CP (ranks holding the same experts).
  const double shard = static_cast<double>(l.data_replicas()) * l.cp;
  const double expert_shard = static_cast<double>(l.dp) * l.cp;
  const double tokens = static_cast<double>(l.micro_batch_size) * w.seq_len / l.cp;
  const double h = static_cast<double>(w.model.hidden_size);
  const double e = r.activation_bytes;
  const double act_layer = ActivationBytesPerLayer(w, l, k);
  const StageParams sp = ParamsOnStage(w, l, stage);
  const double params = sp.layer_params + sp.edge_params;
  MemoryBreakdown b;
  b.stage = stage;
  auto sharded = [&](double bytes_per_param, int from_stage) {
    const bool on = l.zero_stage >= from_stage;
    return (params - sp.expert_params) * bytes_per_param / (on ? shard : 1.0) +
           sp.expert_params * bytes_per_param / (on ? expert_shard : 1.0);
  };
  b.weights = sharded(r.weight_bytes, 3);
  // [pp] Under a pipeline a chunk's gradient is reduced once per step, after
  // its last micro-batch (ZeRO 2/3 too): it stays full-size through the
  // step, next to the reduced shard.
  const bool whole_gradients = l.pp > 1 && l.zero_stage >= 2 && shard > 1;
  constexpr int kNoStage = 4;  // no ZeRO stage shards these
  b.gradients = whole_gradients ? sharded(r.grad_bytes + r.grad_accum_bytes, kNoStage) +
                                      sharded(r.grad_bytes, 2)
                                : sharded(r.grad_bytes + r.grad_accum_bytes, 2);
  b.optimizer = sharded(r.master_bytes + r.optimizer_bytes, 1);

  const double in_flight = MicroBatchesInFlight(l, stage);
  b.micro_batches_in_flight = static_cast<int64_t>(CeilDiv(in_flight, 1.0));
  const int64_t layers = LayersOnStage(w.model.num_layers, l.pp, stage);
  double activations = in_flight * layers * act_layer;
  // Layer-sized working sets: full recompute's backward recomputes one
  // layer at a time into one; a framework may keep more (evaluation).
  const double working_sets = l.recompute == spec::Recompute::kFull
                                  ? std::max(1.0, k.activation_working_sets)
                                  : k.activation_working_sets;
  if (working_sets > 0 || k.backward_scratch_layers > 0) {
    Layout none = l;
    none.recompute = spec::Recompute::kNone;
    // Each layer keeps its own input: a working set holds the rest.
    const double sp_div = l.sequence_parallel ? l.tp : 1;
    activations += working_sets * (ActivationBytesPerLayer(w, none, k) - tokens * h / sp_div * e);
    // Gradients of one layer's GEMM outputs (QKV, attention, gate/up and
    // SwiGLU) and of its input, all tokens: the attention and MLP widths
    // are this rank's.
    const ModelShape& m = w.model;
    const double kv_local =
        std::max(1.0, static_cast<double>(m.num_kv_heads) / l.tp) * m.head_dim();
    const double q_local = static_cast<double>(m.num_heads) * m.head_dim() / l.tp;
    const double f_local = m.ActiveFfnWidth() / l.tp;
    const double mlp = (m.gated_mlp ? 3.0 : 2.0) * f_local;
    activations +=
        k.backward_scratch_layers * tokens * (h + 2.0 * q_local + 2.0 * kv_local + mlp) * e;
  }
  if (sp.lm_head_rows > 0) {
    // The final norm's input and the gradient leaving it (rows sharded by
    // SP), and its output (all tokens, the head's input).
    const double sp_div = l.sequence_parallel ? l.tp : 1;
    activations += k.final_norm_buffer_sets * tokens * (2.0 * h / sp_div + h) * e;
  }
  b.activations = activations * k.activation_factor;
  b.logits = tokens * sp.lm_head_rows * k.logits_bytes_per_element;

  const double layer = static_cast<double>(w.params.layer_linear) / l.tp + ExpertParamsPerLayer(w, l);
  const double layer_grad = layer * (r.grad_bytes + r.grad_accum_bytes);
  if (l.zero_stage == 2 && shard > 1 && !whole_gradients) {
    // Full-size gradients of the layers whose reduce-scatter is pending.
    b.gradients += k.zero2_unreduced_gradient_layers * layer_grad;
  }
  if (l.zero_stage >= 3 && shard > 1) {
    // Two layers gathered (the current one and the prefetched next), and
    // the unsharded gradients before their reduce-scatter.
    b.zero3_gathered = layer * 2.0 * r.weight_bytes +
                       (whole_gradients ? 0.0 : k.zero3_unreduced_gradient_layers * layer_grad);
    if (sp.lm_head_rows > 0) b.zero3_gathered += sp.lm_head_rows * h * r.weight_bytes;
  }

  double buffers = 0;
  if (shard > 1) {
    buffers += k.dp_bucket_buffers * w.dp_bucket_bytes;
    if (l.zero_stage >= 1) {
      // ZeRO-2/3 buckets never cross a layer; ZeRO-1's span the model.
      const double span = (l.zero_stage >= 2 ? layer : params) * r.grad_reduce_bytes;
      buffers += k.zero_shard_buffers * std::min(w.dp_bucket_bytes, span) / shard;
    }
  }
  if (l.tp > 1 && (l.sequence_parallel || k.tp_staging_without_sp)) {
    const double sp_div = l.sequence_parallel ? l.tp : 1;
    buffers += (k.tp_token_buffers + k.tp_row_buffers / sp_div) * tokens * h * e;
  }
  if (l.pp > 1) buffers += 2.0 * tokens * h / (l.sequence_parallel ? l.tp : 1) * e;
  if (l.cp > 1) {
    // The CP ring (worker/engine/context_parallel/ring_attention.h): this
    // rank's q and dq, two K/V blocks in flight, two dK/dV accumulators and
    // one step's dK/dV share, in fp32 (the ops API's dtype) whatever the
    // recipe.
    const ModelShape& m = w.model;
    const double q_local = static_cast<double>(m.num_heads) * m.head_dim() / l.tp;
    const double kv_local = std::max(1.0, static_cast<double>(m.num_kv_heads) / l.tp) * m.head_dim();
    buffers += tokens * (2.0 * q_local + 10.0 * kv_local) * 4.0;
  }
  b.comm_buffers = buffers;
  b.overhead = k.memory_overhead_bytes;
  // A snapshot holds what the rank holds of the state: weights, master copy
  // and moments, sharded as ZeRO shards them (docs/fault_tolerance.md).
  b.snapshots = static_cast<double>(w.snapshot_copies) * (b.weights + b.optimizer);
  b.snapshots_on_device = w.host_is_device;
  return b;
}

MemoryBreakdown EstimateMemory(const Workload& w, const Layout& l, const PlannerConstants& k) {
  // The first stage holds the most micro-batches in flight, the last the LM
  // head and logits: one of them is the peak.
  MemoryBreakdown worst = EstimateStageMemory(w, l, k, 0);
  if (l.pp > 1) {
    MemoryBreakdown last = EstimateStageMemory(w, l, k, l.pp - 1);
    const double most_snapshots = std::max(worst.snapshots, last.snapshots);
    if (last.total() > worst.total()) worst = last;
    // Host snapshots are counted per node, whatever the stages of its ranks:
    // the most any rank holds (the middle stages hold fewer layers).
    if (!worst.snapshots_on_device) worst.snapshots = most_snapshots;
  }
  return worst;
}

}  // namespace loom::planner
