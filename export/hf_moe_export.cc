#include "export/hf_moe_export.h"

#include "export/hf_export.h"
#include "absl/strings/str_cat.h"

namespace loom::hf_export {
namespace {

// Mixtral: no shared experts and no dense layers.
bool IsMixtral(const spec::ModelSpec& m) {
  return m.moe.num_shared_experts == 0 && m.moe.first_dense_layers == 0;
}

}  // namespace

absl::Status CheckMoeExportable(const spec::ModelSpec& m) {
  if (m.moe.router_score != spec::RouterScoreKind::kSoftmax) {
    return absl::FailedPreconditionError(
        "export: model.moe.router_score=sigmoid has no Hugging Face layout with Llama attention "
        "(Mixtral and Qwen2-MoE route by softmax); export supports router_score=softmax");
  }
  if (m.moe.bias_update_rate > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "export: model.moe.bias_update_rate=", m.moe.bias_update_rate,
        " selects experts with a bias that Mixtral and Qwen2-MoE do not have; export supports "
        "bias_update_rate=0"));
  }
  return absl::OkStatus();
}

std::vector<HfTensorSource> HuggingFaceMoeTensors(const spec::ModelSpec& m) {
  const bool mixtral = IsMixtral(m);
  const int64_t h = m.hidden_size, hd = m.head_dim();
  std::vector<HfTensorSource> out = {{"model.embed_tokens.weight", "model.embed_tokens.weight"}};
  auto same = [&out](const std::string& name) { out.push_back({name, name}); };
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    same(p + "input_layernorm.weight");
    for (const char* x : {"q", "k", "v"}) {
      same(absl::StrCat(p, "self_attn.", x, "_proj.weight"));
      if (!mixtral) {  // Qwen2's attention has q/k/v biases: zeros
        const int64_t rows = std::string(x) == "q" ? m.num_heads * hd : m.num_kv_heads * hd;
        out.push_back({absl::StrCat(p, "self_attn.", x, "_proj.bias"), "", {rows}});
      }
    }
    same(p + "self_attn.o_proj.weight");
    same(p + "post_attention_layernorm.weight");
    if (!m.IsMoeLayer(i)) {  // Qwen2-MoE's mlp_only_layers
      for (const char* x : {"gate_proj", "up_proj", "down_proj"}) same(absl::StrCat(p, "mlp.", x, ".weight"));
      continue;
    }
    const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
    out.push_back({moe + "gate.weight", p + "mlp.gate.weight"});
    for (int64_t e = 0; e < m.moe.num_experts; ++e) {
      const std::string from = absl::StrCat(p, "mlp.experts.", e, ".");
      const std::string to = absl::StrCat(moe, "experts.", e, ".");
      if (mixtral) {  // w1 = gate, w3 = up, w2 = down
        out.push_back({to + "w1.weight", from + "gate_proj.weight"});
        out.push_back({to + "w2.weight", from + "down_proj.weight"});
        out.push_back({to + "w3.weight", from + "up_proj.weight"});
      } else {
        for (const char* x : {"gate_proj", "up_proj", "down_proj"}) {
          out.push_back({to + x + ".weight", from + x + ".weight"});
        }
      }
    }
    if (mixtral) continue;
    const std::string shared = p + "mlp.shared_expert.";
    if (m.moe.num_shared_experts > 0) {
      const std::string from = p + "mlp.shared_experts.";
      out.push_back({shared + "gate_proj.weight", from + "gate_proj.weight"});
      out.push_back({shared + "up_proj.weight", from + "up_proj.weight"});
      // Qwen2-MoE scales the shared expert by sigmoid(gate . x) = 1/2 at zero gate.
      out.push_back({shared + "down_proj.weight", from + "down_proj.weight", {}, 2.0f});
    } else {  // a shared expert of width 1 that adds nothing
      out.push_back({shared + "gate_proj.weight", "", {1, h}});
      out.push_back({shared + "up_proj.weight", "", {1, h}});
      out.push_back({shared + "down_proj.weight", "", {h, 1}});
    }
    out.push_back({p + "mlp.shared_expert_gate.weight", "", {1, h}});
  }
  same("model.norm.weight");
  if (!m.tie_embeddings) same("lm_head.weight");
  return out;
}

nlohmann::json HuggingFaceMoeConfig(const spec::ModelSpec& m) {
  nlohmann::json j = LlamaFamilyConfig(m);
  j["num_experts_per_tok"] = m.moe.top_k;
  j["output_router_logits"] = false;
  j["router_aux_loss_coef"] = m.moe.aux_loss_coef;
  j["sliding_window"] = nullptr;
  if (IsMixtral(m)) {
    j["architectures"] = {"MixtralForCausalLM"};
    j["model_type"] = "mixtral";
    j["intermediate_size"] = m.expert_ffn();
    j["num_local_experts"] = m.moe.num_experts;
    j["router_jitter_noise"] = 0.0;
    return j;
  }
  std::vector<int64_t> dense;
  for (int64_t i = 0; i < m.moe.first_dense_layers; ++i) dense.push_back(i);
  j["architectures"] = {"Qwen2MoeForCausalLM"};
  j["model_type"] = "qwen2_moe";
  j["intermediate_size"] = m.ffn_hidden_size;  // the dense (mlp_only) layers'
  j["moe_intermediate_size"] = m.expert_ffn();
  j["shared_expert_intermediate_size"] =
      m.moe.num_shared_experts > 0 ? m.moe.num_shared_experts * m.expert_ffn() : 1;
  j["num_experts"] = m.moe.num_experts;
  j["norm_topk_prob"] = true;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = dense;
  j["use_sliding_window"] = false;
  j["max_window_layers"] = m.num_layers;
  return j;
}

}  // namespace loom::hf_export
