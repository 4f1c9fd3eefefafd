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

nlohmann::json ModelSpecToJson(const spec::ModelSpec& m) {
  return {{"vocab_size", m.vocab_size},         {"hidden_size", m.hidden_size},
          {"num_layers", m.num_layers},         {"num_heads", m.num_heads},
          {"num_kv_heads", m.num_kv_heads},     {"ffn_hidden_size", m.ffn_hidden_size},
          {"max_seq_len", m.max_seq_len},       {"rope_theta", m.rope_theta},
          {"tie_embeddings", m.tie_embeddings}, {"norm_eps", m.norm_eps}};
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
      {"tie_embeddings", {job.tie_embeddings, ckpt.tie_embeddings}}};
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
