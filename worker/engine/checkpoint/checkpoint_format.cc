#include "worker/engine/checkpoint/checkpoint_format.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::engine {

namespace fs = std::filesystem;

std::string StepDirName(int64_t step) { return absl::StrFormat("step_%08d", step); }

std::optional<int64_t> ParseStepDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.substr(0, kPrefix.size()) != kPrefix || name.size() <= kPrefix.size()) return std::nullopt;
  std::string_view digits = name.substr(kPrefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  if (digits.size() > 18) return std::nullopt;
  int64_t step = 0;
  for (char c : digits) step = step * 10 + (c - '0');
  return step;
}

std::vector<std::pair<int64_t, std::string>> ListStepDirs(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory(ec)) continue;
    if (std::optional<int64_t> step = ParseStepDirName(e.path().filename().string())) {
      out.emplace_back(*step, e.path().string());
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::optional<std::string> NewestCommittedStepDir(const std::string& root) {
  for (const auto& [step, dir] : ListStepDirs(root)) {
    std::error_code ec;
    if (fs::exists(fs::path(dir) / kCheckpointMetadataFile, ec)) return dir;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> ResolveStepDir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", path, " does not exist"));
  }
  if (fs::exists(fs::path(path) / kCheckpointMetadataFile, ec)) return path;
  if (std::optional<std::string> dir = NewestCommittedStepDir(path)) return *dir;
  return absl::NotFoundError(absl::StrCat(
      "checkpoint directory ", path,
      " holds no committed step (no step_NNNNNNNN/ with metadata.json, and no metadata.json of its own)"));
}

// [moe] model.moe in metadata.json: every field, so export and resume see
// the model the checkpoint was trained as.
nlohmann::json MoeSpecToJson(const spec::MoeSpec& e) {
  nlohmann::json j = {{"num_experts", e.num_experts},
                      {"top_k", e.top_k},
                      {"expert_ffn_hidden_size", e.expert_ffn_hidden_size},
                      {"num_shared_experts", e.num_shared_experts},
                      {"first_dense_layers", e.first_dense_layers},
                      {"router_score", spec::RouterScoreName(e.router_score)},
                      {"aux_loss_coef", e.aux_loss_coef},
                      {"bias_update_rate", e.bias_update_rate}};
  if (e.capacity_factor) j["capacity_factor"] = *e.capacity_factor;
  return j;
}

absl::StatusOr<spec::MoeSpec> MoeSpecFromJson(const nlohmann::json& j, const std::string& source) {
  spec::MoeSpec e;
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(source, ": model.moe is not an object"));
  for (const auto& [key, out] :
       {std::pair{"num_experts", &e.num_experts}, std::pair{"top_k", &e.top_k},
        std::pair{"expert_ffn_hidden_size", &e.expert_ffn_hidden_size},
        std::pair{"num_shared_experts", &e.num_shared_experts},
        std::pair{"first_dense_layers", &e.first_dense_layers}}) {
    if (!j.contains(key) || !j[key].is_number_integer()) {
      return absl::DataLossError(absl::StrCat(source, ": model.moe.", key, " missing or not an integer"));
    }
    *out = j[key].get<int64_t>();
  }
  for (const auto& [key, out] : {std::pair{"aux_loss_coef", &e.aux_loss_coef},
                                 std::pair{"bias_update_rate", &e.bias_update_rate}}) {
    if (!j.contains(key) || !j[key].is_number()) {
      return absl::DataLossError(absl::StrCat(source, ": model.moe.", key, " missing or not a number"));
    }
    *out = j[key].get<double>();
  }
  const nlohmann::json score = j.value("router_score", nlohmann::json());
  if (score == "softmax" || score == "sigmoid") {
    e.router_score = score == "softmax" ? spec::RouterScoreKind::kSoftmax : spec::RouterScoreKind::kSigmoid;
  } else {
    return absl::DataLossError(absl::StrCat(source, ": model.moe.router_score must be softmax or sigmoid"));
  }
  if (j.contains("capacity_factor")) {
    if (!j["capacity_factor"].is_number()) {
      return absl::DataLossError(absl::StrCat(source, ": model.moe.capacity_factor is not a number"));
    }
    e.capacity_factor = j["capacity_factor"].get<double>();
  }
  return e;
}

nlohmann::json ModelSpecToJson(const spec::ModelSpec& m) {
  nlohmann::json j = {{"vocab_size", m.vocab_size},         {"hidden_size", m.hidden_size},
                      {"num_layers", m.num_layers},         {"num_heads", m.num_heads},
                      {"num_kv_heads", m.num_kv_heads},     {"ffn_hidden_size", m.ffn_hidden_size},
                      {"max_seq_len", m.max_seq_len},       {"rope_theta", m.rope_theta},
                      {"tie_embeddings", m.tie_embeddings}, {"norm_eps", m.norm_eps}};
  if (m.moe.enabled()) j["moe"] = MoeSpecToJson(m.moe);  // [moe] absent: dense
  return j;
}

absl::StatusOr<spec::ModelSpec> ModelSpecFromJson(const nlohmann::json& j,
                                                  const std::string& source) {
  spec::ModelSpec m;
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(source, ": \"model\" is not an object"));
  auto get_int = [&](const char* key, int64_t* out) -> absl::Status {
    if (!j.contains(key) || !j[key].is_number_integer()) {
      return absl::DataLossError(absl::StrCat(source, ": model.", key, " missing or not an integer"));
    }
    *out = j[key].get<int64_t>();
    return absl::OkStatus();
  };
  auto get_num = [&](const char* key, double* out) -> absl::Status {
    if (!j.contains(key) || !j[key].is_number()) {
      return absl::DataLossError(absl::StrCat(source, ": model.", key, " missing or not a number"));
    }
    *out = j[key].get<double>();
    return absl::OkStatus();
  };
  for (absl::Status s : {get_int("vocab_size", &m.vocab_size), get_int("hidden_size", &m.hidden_size),
                         get_int("num_layers", &m.num_layers), get_int("num_heads", &m.num_heads),
                         get_int("num_kv_heads", &m.num_kv_heads),
                         get_int("ffn_hidden_size", &m.ffn_hidden_size),
                         get_int("max_seq_len", &m.max_seq_len), get_num("rope_theta", &m.rope_theta),
                         get_num("norm_eps", &m.norm_eps)}) {
    if (!s.ok()) return s;
  }
  if (!j.contains("tie_embeddings") || !j["tie_embeddings"].is_boolean()) {
    return absl::DataLossError(absl::StrCat(source, ": model.tie_embeddings missing or not a boolean"));
  }
  m.tie_embeddings = j["tie_embeddings"].get<bool>();
  if (j.contains("moe")) {  // [moe]
    absl::StatusOr<spec::MoeSpec> moe = MoeSpecFromJson(j["moe"], source);
    if (!moe.ok()) return moe.status();
    m.moe = *moe;
  }
  return m;
}

absl::Status CheckSameModelShape(const spec::ModelSpec& job, const spec::ModelSpec& ckpt,
                                 const std::string& source) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"vocab_size", {job.vocab_size, ckpt.vocab_size}},
      {"hidden_size", {job.hidden_size, ckpt.hidden_size}},
      {"num_layers", {job.num_layers, ckpt.num_layers}},
      {"num_heads", {job.num_heads, ckpt.num_heads}},
      {"num_kv_heads", {job.num_kv_heads, ckpt.num_kv_heads}},
      {"ffn_hidden_size", {job.ffn_hidden_size, ckpt.ffn_hidden_size}},
      {"tie_embeddings", {job.tie_embeddings, ckpt.tie_embeddings}},
      {"moe.num_experts", {job.moe.num_experts, ckpt.moe.num_experts}},  // [moe] the tensors' shapes
      {"moe.expert_ffn_hidden_size", {job.expert_ffn(), ckpt.expert_ffn()}},
      {"moe.num_shared_experts", {job.moe.num_shared_experts, ckpt.moe.num_shared_experts}},
      {"moe.first_dense_layers", {job.moe.first_dense_layers, ckpt.moe.first_dense_layers}}};
  for (const auto& [name, values] : fields) {
    if (values.first != values.second) {
      return absl::FailedPreconditionError(
          absl::StrCat(source, ": model mismatch: checkpoint has model.", name, "=", values.second,
                       " but the job has ", values.first));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
