#include "worker/engine/model/parameter_layout.h"

#include <cmath>

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

}  // namespace loom::engine
