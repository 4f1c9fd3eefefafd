#include "worker/engine/model/parameter_layout.h"

#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"

namespace loom::engine {

namespace {

// Every offset of a layer through `f` (its flags and counts kept): the one
// list of a layer's offsets, for the layouts that move or renumber them.
template <typename F>
LayerOffsets MapOffsets(LayerOffsets l, const F& f) {
  for (int64_t* at : {&l.input_norm, &l.qkv, &l.o, &l.post_norm, &l.gate_up, &l.down, &l.router,
                      &l.experts, &l.shared_gate_up, &l.shared_down}) {
    *at = f(*at);
  }
  return l;
}

}  // namespace

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
    const size_t first_entry = layout.entries.size() - 6;
    if (c.IsMoeLayer(i)) {  // [moe] every tensor whole; under TP (no SP) every TP rank holds it (replicas)
      const int64_t ef = c.expert_ffn(), sf = c.moe.num_shared_experts * ef;
      l.moe = true;
      l.gate_up = l.down = -1;
      l.router = add(p + "mlp.gate.weight", {c.moe.num_experts, h}, -1, 0, 0, all, kStd);
      for (int64_t e = 0; e < c.moe.num_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        const int64_t at = add(x + "gate_proj.weight", {ef, h}, -1, 0, 0, all, kStd);
        if (e == 0) l.experts = at;
        add(x + "up_proj.weight", {ef, h}, -1, 0, 0, all, kStd);
        add(x + "down_proj.weight", {h, ef}, -1, 0, 0, all, residual_std);
      }
      if (sf > 0) {
        l.shared_gate_up = add(p + "mlp.shared_experts.gate_proj.weight", {sf, h}, -1, 0, 0, all, kStd);
        add(p + "mlp.shared_experts.up_proj.weight", {sf, h}, -1, 0, 0, all, kStd);
        l.shared_down =
            add(p + "mlp.shared_experts.down_proj.weight", {h, sf}, -1, 0, 0, all, residual_std);
      }
    } else {
      l.gate_up = add(p + "mlp.gate_proj.weight", {f, h}, 0, tp.ffn_first, tp.ffn, 1, kStd);
      add(p + "mlp.up_proj.weight", {f, h}, 0, tp.ffn_first, tp.ffn, 1, kStd);
      l.down = add(p + "mlp.down_proj.weight", {h, f}, 1, tp.ffn_first, tp.ffn, 1, residual_std);
    }
    l.entries = static_cast<int64_t>(layout.entries.size() - first_entry);
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

namespace {

ParameterLayout LayerSlice(const spec::ModelSpec& c, const TpPlan& tp, const ModelPart& part) {
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
  if (part.embedding) out.embed = keep(whole.embed, 1);
  for (int64_t l = first; l < first + count; ++l) {
    const LayerOffsets& w = whole.layers[static_cast<size_t>(l)];
    const int64_t base = keep(w.input_norm, w.entries);
    // Every offset of the layer moves with its first tensor; -1 stays -1.
    auto moved = [&](int64_t at) { return at < 0 ? at : base + (at - w.input_norm); };
    LayerOffsets o = MapOffsets(w, moved);
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

// [ep] The expert index of a routed expert's tensor, -1 for any other.
int64_t ExpertOf(const std::string& name) {
  static const std::string kTag = ".mlp.experts.";
  const size_t at = name.find(kTag);
  if (at == std::string::npos) return -1;
  return std::stoll(name.substr(at + kTag.size()));
}

// [ep] `in` without the routed experts outside [first, first + held),
// offsets packed again.
ParameterLayout HoldExperts(const ParameterLayout& in, const spec::ModelSpec& c, int64_t first,
                            int64_t held) {
  ParameterLayout out;
  std::map<int64_t, int64_t> moved;  // old offset -> new, kept entries
  for (const ParameterEntry& e : in.entries) {
    const int64_t expert = ExpertOf(e.name);
    if (expert >= 0 && (expert < first || expert >= first + held)) continue;
    ParameterEntry k = e;
    k.offset = out.total;
    moved[e.offset] = k.offset;
    out.total += k.numel;
    out.entries.push_back(std::move(k));
  }
  auto at = [&](int64_t old) {
    auto it = moved.find(old);
    return old < 0 || it == moved.end() ? int64_t{-1} : it->second;
  };
  const int64_t stride = 3 * c.expert_ffn() * c.hidden_size;  // one expert's gate, up, down
  for (const LayerOffsets& l : in.layers) {
    LayerOffsets o = MapOffsets(l, at);
    o.experts = l.moe ? at(l.experts + first * stride) : -1;
    if (l.moe) o.entries = l.entries - 3 * (c.moe.num_experts - held);
    out.layers.push_back(o);
  }
  out.embed = at(in.embed);
  out.final_norm = at(in.final_norm);
  out.lm_head = at(in.lm_head);
  return out;
}

}  // namespace

ParameterLayout MakeParameterLayout(const spec::ModelSpec& c, const TpPlan& tp,
                                    const ModelPart& part) {
  ParameterLayout sliced = LayerSlice(c, tp, part);
  if (part.held_experts < 0 || part.held_experts == c.moe.num_experts) return sliced;
  return HoldExperts(sliced, c, part.first_expert, part.held_experts);
}

}  // namespace loom::engine
