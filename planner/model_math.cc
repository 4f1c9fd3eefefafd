// Parameter counts and FLOPs per token of the planner's model shapes.
#include "planner/model_math.h"

namespace loom::planner {

ModelShape ModelShapeFromSpec(const spec::ModelSpec& model, const std::string& name) {
  ModelShape shape;
  shape.name = name;
  shape.vocab_size = model.vocab_size;
  shape.hidden_size = model.hidden_size;
  shape.num_layers = model.num_layers;
  shape.num_heads = model.num_heads;
  shape.num_kv_heads = model.num_kv_heads > 0 ? model.num_kv_heads : model.num_heads;
  shape.ffn_hidden_size = model.ffn_hidden_size;
  shape.tie_embeddings = model.tie_embeddings;
  if (model.moe.enabled()) {  // [moe]
    shape.num_experts = model.moe.num_experts;
    shape.top_k = model.moe.top_k;
    shape.expert_ffn = model.expert_ffn();
    shape.shared_ffn = model.moe.num_shared_experts * model.expert_ffn();
    shape.first_dense_layers = model.moe.first_dense_layers;
  }
  return shape;
}

ParamCount CountParams(const ModelShape& m) {
  ParamCount c;
  const int64_t h = m.hidden_size;
  const int64_t q = m.num_heads * m.head_dim();
  const int64_t kv = m.kv_dim();
  const int64_t f = m.ffn_hidden_size;
  const int64_t norm = m.layer_norm ? 2 * h : h;
  int64_t attention = h * q + 2 * h * kv + q * h;
  int64_t mlp = (m.gated_mlp ? 3 : 2) * h * f;
  if (m.linear_bias) {
    attention += q + 2 * kv + h;
    mlp += (m.gated_mlp ? 2 : 1) * f + h;
  }
  c.layer_linear = attention + mlp;
  c.layer_replicated = 2 * norm;
  c.embedding = m.vocab_size * h;
  c.position_embedding = m.learned_positions * h;
  c.lm_head = m.tie_embeddings ? 0 : m.vocab_size * h;
  c.final_norm = norm;
  int64_t layers_linear = m.num_layers * c.layer_linear;
  if (m.moe_layers() > 0) {  // [moe] router and shared experts replace the MLP; experts apart
    const int64_t moe = m.moe_layers();
    const int64_t moe_linear = attention + m.num_experts * h + 3 * h * m.shared_ffn;
    layers_linear = (m.num_layers - moe) * c.layer_linear + moe * moe_linear;
    c.layer_linear = layers_linear / m.num_layers;
    c.experts = moe * m.num_experts * 3 * h * m.expert_ffn;
  }
  c.total = c.embedding + c.position_embedding + c.lm_head + c.final_norm + layers_linear +
            m.num_layers * c.layer_replicated + c.experts;
  c.active = c.total - (m.num_experts > 0 ? c.experts / m.num_experts * (m.num_experts - m.top_k) : 0);
  return c;
}

double ModelFlopsPerToken(const ModelShape& m, int64_t seq_len) {
  const double n = static_cast<double>(CountParams(m).active);
  return 6.0 * n + 12.0 * m.num_layers * m.hidden_size * static_cast<double>(seq_len);
}

double HardwareFlopsPerToken(const ModelShape& m, int64_t seq_len, spec::Recompute recompute) {
  const double n = static_cast<double>(CountParams(m).active);
  const double attention = 4.0 * m.num_layers * m.hidden_size * static_cast<double>(seq_len);
  switch (recompute) {
    case spec::Recompute::kFull:
      return 8.0 * n + 4.0 * attention;
    case spec::Recompute::kSelective:
      return 6.0 * n + 4.0 * attention;
    case spec::Recompute::kNone:
      break;
  }
  return 6.0 * n + 3.0 * attention;
}

}  // namespace loom::planner
