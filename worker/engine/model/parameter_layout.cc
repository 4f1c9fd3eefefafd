#include "worker/engine/model/parameter_layout.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace loom::engine {

ParameterLayout MakeParameterLayout(const spec::ModelSpec& c) {
  return MakeParameterLayout(c, MakeTpPlan(c, 0, 1, false));
}

ParameterLayout MakeParameterLayout(const spec::ModelSpec& c, const TpPlan& tp) {
  constexpr double kStd = 0.02;
  const double residual_std = kStd / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  const int64_t h = c.hidden_size, hd = c.head_dim();
  const int64_t q_dim = c.num_heads * hd, kv_dim = c.num_kv_heads * hd;
  const int64_t f = c.ffn_hidden_size;
  const int all = tp.size;  // replicas of a tensor every TP rank holds whole
  ParameterLayout layout;
  // global: the full tensor's shape; axis/first/count: the slice this rank
  // holds (axis -1: all of it); replicas: ranks holding that same slice.
  auto add = [&](std::string name, std::vector<int64_t> global, int axis, int64_t first,
                 int64_t count, int replicas, double init_std) {
    ParameterEntry e;
    e.name = std::move(name);
    e.shape = global;
    if (axis >= 0 && count != global[static_cast<size_t>(axis)]) {
      e.shape[static_cast<size_t>(axis)] = count;
      e.shard_axis = axis;
      e.shard_offset = first;
    }
    if (tp.active()) e.global_shape = global;
    e.replicas = tp.active() ? replicas : 1;
    e.numel = 1;
    for (int64_t d : e.shape) e.numel *= d;
    e.offset = layout.total;
    e.init_std = init_std;
    e.init_index = static_cast<int64_t>(layout.entries.size());
    layout.total += e.numel;
    layout.entries.push_back(std::move(e));
    return layout.entries.back().offset;
  };
  const int64_t q_first = tp.head_first * hd, q_rows = tp.heads * hd;
  const int64_t kv_first = tp.kv_head_first * hd, kv_rows = tp.kv_heads * hd;
  layout.embed = add("model.embed_tokens.weight", {c.vocab_size, h}, 0, tp.vocab_first, tp.vocab,
                     1, kStd);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerOffsets l;
    l.input_norm = add(p + "input_layernorm.weight", {h}, -1, 0, 0, all, 0.0);
    l.qkv = add(p + "self_attn.q_proj.weight", {q_dim, h}, 0, q_first, q_rows, 1, kStd);
    add(p + "self_attn.k_proj.weight", {kv_dim, h}, 0, kv_first, kv_rows, tp.kv_replicas, kStd);
    add(p + "self_attn.v_proj.weight", {kv_dim, h}, 0, kv_first, kv_rows, tp.kv_replicas, kStd);
    l.o = add(p + "self_attn.o_proj.weight", {h, q_dim}, 1, q_first, q_rows, 1, residual_std);
    l.post_norm = add(p + "post_attention_layernorm.weight", {h}, -1, 0, 0, all, 0.0);
    l.gate_up = add(p + "mlp.gate_proj.weight", {f, h}, 0, tp.ffn_first, tp.ffn, 1, kStd);
    add(p + "mlp.up_proj.weight", {f, h}, 0, tp.ffn_first, tp.ffn, 1, kStd);
    l.down = add(p + "mlp.down_proj.weight", {h, f}, 1, tp.ffn_first, tp.ffn, 1, residual_std);
    layout.layers.push_back(l);
  }
  layout.final_norm = add("model.norm.weight", {h}, -1, 0, 0, all, 0.0);
  layout.lm_head = c.tie_embeddings ? layout.embed
                                    : add("lm_head.weight", {c.vocab_size, h}, 0, tp.vocab_first,
                                          tp.vocab, 1, kStd);
  return layout;
}

// ---- [pp] pipeline parts -----------------------------------------------------

absl::Status CheckModelPart(const spec::ModelSpec& c, const ModelPart& part) {
  const int64_t n = part.num_layers < 0 ? c.num_layers - part.first_layer : part.num_layers;
  if (part.first_layer < 0 || n < 0 || part.first_layer + n > c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline part layers [", part.first_layer, ", ", part.first_layer + n,
        ") are outside model.num_layers=", c.num_layers));
  }
  return absl::OkStatus();
}

ParameterLayout MakeParameterLayout(const spec::ModelSpec& c, const TpPlan& tp,
                                    const ModelPart& part) {
  const ParameterLayout whole = MakeParameterLayout(c, tp);
  if (part.Whole(c)) return whole;
  const int64_t first = part.first_layer;
  const int64_t count = part.num_layers < 0 ? c.num_layers - first : part.num_layers;
  ParameterLayout out;
  out.embed = out.final_norm = out.lm_head = -1;
  // Entries by offset in the whole layout, so each kept one is found once.
  auto keep = [&](int64_t whole_offset, int64_t span_entries) {
    int64_t at = -1;
    for (size_t i = 0; i < whole.entries.size(); ++i) {
      if (whole.entries[i].offset != whole_offset) continue;
      for (int64_t k = 0; k < span_entries; ++k) {
        ParameterEntry e = whole.entries[i + static_cast<size_t>(k)];
        e.offset = out.total;
        if (k == 0) at = e.offset;
        out.total += e.numel;
        out.entries.push_back(std::move(e));
      }
      break;
    }
    return at;
  };
  constexpr int64_t kLayerEntries = 9;  // two norms, q, k, v, o, gate, up, down
  if (part.embedding) out.embed = keep(whole.embed, 1);
  for (int64_t l = first; l < first + count; ++l) {
    const int64_t base = keep(whole.layers[static_cast<size_t>(l)].input_norm, kLayerEntries);
    const LayerOffsets& w = whole.layers[static_cast<size_t>(l)];
    LayerOffsets o;
    o.input_norm = base;
    o.qkv = base + (w.qkv - w.input_norm);
    o.o = base + (w.o - w.input_norm);
    o.post_norm = base + (w.post_norm - w.input_norm);
    o.gate_up = base + (w.gate_up - w.input_norm);
    o.down = base + (w.down - w.input_norm);
    out.layers.push_back(o);
  }
  if (part.head) {
    out.final_norm = keep(whole.final_norm, 1);
    // [pp] A tied head without the embedding holds its own copy of the
    // embedding (same name, same init stream), after the final norm; the
    // pipeline keeps the copies equal by summing their gradients between the
    // first and the last stage (Megatron's shared embedding).
    out.lm_head = !c.tie_embeddings ? keep(whole.lm_head, 1)
                  : part.embedding  ? out.embed
                                    : keep(whole.embed, 1);
  }
  return out;
}

}  // namespace loom::engine
