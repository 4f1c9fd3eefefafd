#include "worker/engine/model/parameter_layout.h"

#include <cmath>

namespace loom::engine {

ParameterLayout MakeParameterLayout(const spec::ModelSpec& c) {
  constexpr double kStd = 0.02;
  const double residual_std = kStd / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  const int64_t h = c.hidden_size, hd = c.head_dim();
  const int64_t q_dim = c.num_heads * hd, kv_dim = c.num_kv_heads * hd;
  const int64_t f = c.ffn_hidden_size;
  ParameterLayout layout;
  auto add = [&](std::string name, std::vector<int64_t> shape, double init_std) {
    ParameterEntry e;
    e.name = std::move(name);
    e.numel = 1;
    for (int64_t d : shape) e.numel *= d;
    e.shape = std::move(shape);
    e.offset = layout.total;
    e.init_std = init_std;
    layout.total += e.numel;
    layout.entries.push_back(std::move(e));
    return layout.entries.back().offset;
  };
  layout.embed = add("model.embed_tokens.weight", {c.vocab_size, h}, kStd);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerOffsets l;
    l.input_norm = add(p + "input_layernorm.weight", {h}, 0.0);
    l.qkv = add(p + "self_attn.q_proj.weight", {q_dim, h}, kStd);
    add(p + "self_attn.k_proj.weight", {kv_dim, h}, kStd);
    add(p + "self_attn.v_proj.weight", {kv_dim, h}, kStd);
    l.o = add(p + "self_attn.o_proj.weight", {h, q_dim}, residual_std);
    l.post_norm = add(p + "post_attention_layernorm.weight", {h}, 0.0);
    l.gate_up = add(p + "mlp.gate_proj.weight", {f, h}, kStd);
    add(p + "mlp.up_proj.weight", {f, h}, kStd);
    l.down = add(p + "mlp.down_proj.weight", {h, f}, residual_std);
    layout.layers.push_back(l);
  }
  layout.final_norm = add("model.norm.weight", {h}, 0.0);
  layout.lm_head = c.tie_embeddings ? layout.embed : add("lm_head.weight", {c.vocab_size, h}, kStd);
  return layout;
}

}  // namespace loom::engine
