#include "export/hf_export.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "worker/engine/checkpoint/checkpoint_format.h"
#include "worker/engine/checkpoint/checkpoint_checks.h"
#include "worker/engine/checkpoint/checkpoint_reader.h"
#include "worker/engine/checkpoint/durable_file.h"
#include "worker/engine/checkpoint/safetensors.h"
#include "export/hf_moe_export.h"

namespace loom::hf_export {

namespace fs = std::filesystem;
using engine::CheckpointReader;
using engine::CheckedElementCount;
using engine::CheckpointTensorInfo;
using engine::kMaxCheckpointElements;
using engine::FileDigest;
using engine::FsyncDirectory;
using engine::ResolveStepDir;
using engine::TensorView;
using engine::WriteFileDurably;
using engine::WriteSafetensors;

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

nlohmann::json LlamaFamilyConfig(const spec::ModelSpec& m) {
  return {{"hidden_size", m.hidden_size},
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
          {"attention_dropout", 0.0},
          {"hidden_act", "silu"},
          {"initializer_range", 0.02},
          {"use_cache", true},
          {"torch_dtype", "float32"}};
}

nlohmann::json HuggingFaceConfig(const spec::ModelSpec& m) {
  nlohmann::json j = LlamaFamilyConfig(m);
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["intermediate_size"] = m.ffn_hidden_size;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
  return j;
}

namespace {

// Removes a temporary export directory unless it was moved into place.
class TempDir {
 public:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

absl::Status FsFault(const std::string& what, const std::string& path, int error) {
  return absl::InternalError(
      absl::StrCat("export: cannot ", what, " ", path, ": ", std::strerror(error)));
}

}  // namespace

absl::Status ExportHuggingFace(const std::string& checkpoint_dir, const std::string& out_dir) {
  absl::StatusOr<std::string> step_dir = ResolveStepDir(checkpoint_dir);
  if (!step_dir.ok()) return step_dir.status();
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(*step_dir);
  if (!reader.ok()) return reader.status();

  // Every model field is checked (CheckCheckpointModel) before this point;
  // the layer count is bounded by the tensors the checkpoint really holds.
  const int64_t layers = reader->model().num_layers;
  if (layers > static_cast<int64_t>(reader->tensors().size())) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", *step_dir, ": metadata.json says model.num_layers=", layers,
        " but the checkpoint holds only ", reader->tensors().size(), " tensors"));
  }
  // [moe] An MoE model renames (and fills) tensors for its HF layout.
  const spec::ModelSpec& model = reader->model();
  std::vector<HfTensorSource> sources;
  if (model.moe.enabled()) {
    if (absl::Status s = CheckMoeExportable(model); !s.ok()) return s;
    // Each expert of each MoE layer is three tensors of the checkpoint: a
    // model claiming more (4,096 layers x 4,096 experts) than the checkpoint
    // holds is refused before a list of that many names is made. Both
    // counts are at most 4,096 (the spec's bounds): no overflow.
    const int64_t moe_layers = std::max<int64_t>(0, layers - model.moe.first_dense_layers);
    const int64_t expert_tensors = 3 * moe_layers * model.moe.num_experts;
    if (expert_tensors > static_cast<int64_t>(reader->tensors().size())) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", *step_dir, ": metadata.json says ", moe_layers, " MoE layers of ",
          model.moe.num_experts, " experts (", expert_tensors,
          " expert tensors) but the checkpoint holds only ", reader->tensors().size(),
          " tensors"));
    }
    sources = HuggingFaceMoeTensors(model);
  } else {
    for (const std::string& name : HuggingFaceParameterNames(model)) sources.push_back({name, name});
  }
  // The tensors the HF layout has and Loom does not are zeros made here: at
  // most as many elements as the checkpoint's own model tensors hold (real
  // models have far fewer), so a crafted model's sizes cannot make export
  // allocate what the checkpoint does not back.
  int64_t present = 0, zeros = 0;
  for (const CheckpointTensorInfo& info : reader->tensors()) {
    if (info.group != "model") continue;
    absl::StatusOr<int64_t> n = CheckedElementCount(info.shape, info.name);
    if (!n.ok()) return n.status();
    present = std::min(present + *n, kMaxCheckpointElements);
  }
  for (const HfTensorSource& source : sources) {
    if (!source.loom_name.empty()) continue;
    absl::StatusOr<int64_t> n = CheckedElementCount(source.shape, source.hf_name);
    if (!n.ok()) return n.status();
    zeros = std::min(zeros + *n, kMaxCheckpointElements);
  }
  if (zeros > present) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", *step_dir, ": its model would need ", zeros,
        " zero-filled elements in the Hugging Face layout but the checkpoint holds only ",
        present, " model elements"));
  }
  std::vector<std::vector<float>> storage;
  std::vector<TensorView> tensors;
  storage.reserve(sources.size());
  for (const HfTensorSource& source : sources) {
    if (source.loom_name.empty()) {  // a tensor the HF layout has and Loom does not: zeros
      int64_t n = 1;
      for (int64_t d : source.shape) n *= d;
      storage.emplace_back(static_cast<size_t>(n), 0.0f);
      tensors.push_back({source.hf_name, source.shape, storage.back().data()});
      continue;
    }
    const std::string& name = source.loom_name;
    const CheckpointTensorInfo* info = reader->Find(name);
    if (info == nullptr || info->group != "model") {
      return absl::DataLossError(absl::StrCat("checkpoint ", *step_dir,
                                              ": model parameter ", name, " is missing"));
    }
    absl::StatusOr<std::vector<float>> values = reader->Values(name);
    if (!values.ok()) return values.status();
    if (source.scale != 1.0f) {
      for (float& v : *values) v *= source.scale;
    }
    storage.push_back(std::move(*values));
    tensors.push_back({source.hf_name, info->shape, storage.back().data()});
  }

  const std::string config_text =
      (model.moe.enabled() ? HuggingFaceMoeConfig(model) : HuggingFaceConfig(model)).dump(2) + "\n";

  // Nothing half-written ever shows in out_dir: both files are written whole
  // into a fresh temporary sibling directory, then moved into place by
  // rename (which replaces a file or a symlink there, never follows it).
  fs::path out = fs::path(out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return FsFault("create", parent.string(), ec.value());
  std::string pattern = (parent / absl::StrCat(".", out.filename().string(), ".export-XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) return FsFault("create a directory beside", out.string(), errno);
  TempDir temp(pattern);
  absl::StatusOr<FileDigest> written =
      WriteSafetensors((fs::path(temp.path()) / "model.safetensors").string(), tensors,
                       {{"format", "pt"}, {"loom.step", std::to_string(reader->step())}});
  if (!written.ok()) return written.status();
  absl::StatusOr<FileDigest> cfg =
      WriteFileDurably((fs::path(temp.path()) / "config.json").string(), config_text);
  if (!cfg.ok()) return cfg.status();
  if (absl::Status s = FsyncDirectory(temp.path()); !s.ok()) return s;

  if (rename(temp.path().c_str(), out.c_str()) == 0) {  // out_dir absent (or empty)
    temp.Release();
    return FsyncDirectory(parent.string());
  }
  if (errno != EEXIST && errno != ENOTEMPTY) return FsFault("create", out.string(), errno);
  // out_dir holds other files: each of ours replaces its namesake, weights
  // first, so a config.json never describes weights that are not there yet.
  for (const char* name : {"model.safetensors", "config.json"}) {
    const fs::path from = fs::path(temp.path()) / name;
    const fs::path to = out / name;
    if (rename(from.c_str(), to.c_str()) != 0) return FsFault("replace", to.string(), errno);
  }
  return FsyncDirectory(out.string());
}

}  // namespace loom::hf_export
