#include "worker/engine/export/hf_export.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "worker/engine/checkpoint/checkpoint_format.h"
#include "worker/engine/checkpoint/checkpoint_reader.h"
#include "worker/engine/checkpoint/durable_file.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace loom::engine {

namespace fs = std::filesystem;

std::vector<std::string> HuggingFaceParameterNames(const spec::ModelSpec& m) {
  std::vector<std::string> names = {"model.embed_tokens.weight"};
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    for (const char* suffix :
         {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
      names.push_back(p + suffix);
    }
  }
  names.push_back("model.norm.weight");
  if (!m.tie_embeddings) names.push_back("lm_head.weight");
  return names;
}

nlohmann::json HuggingFaceConfig(const spec::ModelSpec& m) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", m.hidden_size},
          {"intermediate_size", m.ffn_hidden_size},
          {"num_attention_heads", m.num_heads},
          {"num_key_value_heads", m.num_kv_heads},
          {"num_hidden_layers", m.num_layers},
          {"head_dim", m.head_dim()},
          {"vocab_size", m.vocab_size},
          {"max_position_embeddings", m.max_seq_len},
          {"rope_theta", m.rope_theta},
          {"rope_scaling", nullptr},
          {"rms_norm_eps", m.norm_eps},
          {"tie_word_embeddings", m.tie_embeddings},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"attention_dropout", 0.0},
          {"hidden_act", "silu"},
          {"initializer_range", 0.02},
          {"pretraining_tp", 1},
          {"use_cache", true},
          {"torch_dtype", "float32"}};
}

absl::Status ExportHuggingFace(const std::string& checkpoint_dir, const std::string& out_dir) {
  absl::StatusOr<std::string> step_dir = ResolveStepDir(checkpoint_dir);
  if (!step_dir.ok()) return step_dir.status();
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(*step_dir);
  if (!reader.ok()) return reader.status();

  const std::vector<std::string> names = HuggingFaceParameterNames(reader->model());
  std::vector<std::vector<float>> storage;
  std::vector<TensorView> tensors;
  storage.reserve(names.size());
  for (const std::string& name : names) {
    const CheckpointTensorInfo* info = reader->Find(name);
    if (info == nullptr || info->group != "model") {
      return absl::DataLossError(absl::StrCat("checkpoint ", *step_dir,
                                              ": model parameter ", name, " is missing"));
    }
    absl::StatusOr<std::vector<float>> values = reader->Values(name);
    if (!values.ok()) return values.status();
    storage.push_back(std::move(*values));
    tensors.push_back({name, info->shape, storage.back().data()});
  }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("export: cannot create ", out_dir, ": ", ec.message()));
  }
  const std::string weights = (fs::path(out_dir) / "model.safetensors").string();
  absl::StatusOr<FileDigest> written = WriteSafetensors(
      weights, tensors, {{"format", "pt"}, {"loom.step", std::to_string(reader->step())}});
  if (!written.ok()) return written.status();
  const std::string config = (fs::path(out_dir) / "config.json").string();
  absl::StatusOr<FileDigest> cfg =
      WriteFileDurably(config, HuggingFaceConfig(reader->model()).dump(2) + "\n");
  if (!cfg.ok()) return cfg.status();
  return absl::OkStatus();
}

}  // namespace loom::engine
