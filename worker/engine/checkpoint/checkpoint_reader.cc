#include "worker/engine/checkpoint/checkpoint_reader.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/engine/checkpoint/checkpoint_format.h"
#include "worker/engine/checkpoint/crc32.h"
#include "worker/engine/checkpoint/durable_file.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

absl::Status Fault(const std::string& file, const std::string& what) {
  return absl::DataLossError(absl::StrCat("checkpoint file ", file, ": ", what));
}

// Reads a file listed in metadata.json and checks its recorded size and CRC-32.
absl::StatusOr<std::string> ReadVerified(const fs::path& path, const json& entry) {
  const std::string p = path.string();
  if (!entry.is_object() || !entry.contains("bytes") || !entry.contains("crc32") ||
      !entry["bytes"].is_number_integer() || !entry["crc32"].is_string()) {
    return Fault(p, "metadata.json has no valid size and crc32 for it");
  }
  absl::StatusOr<std::string> bytes = ReadFileBytes(p);
  if (!bytes.ok()) return Fault(p, "listed in metadata.json but missing");
  const int64_t want_bytes = entry["bytes"].get<int64_t>();
  if (static_cast<int64_t>(bytes->size()) != want_bytes) {
    return Fault(p, absl::StrCat("size mismatch: ", bytes->size(), " bytes, metadata.json says ",
                                 want_bytes, bytes->size() < static_cast<size_t>(want_bytes)
                                                 ? " (truncated)" : ""));
  }
  const std::string crc = absl::StrFormat("%08x", Crc32(0, bytes->data(), bytes->size()));
  if (crc != entry["crc32"].get<std::string>()) {
    return Fault(p, absl::StrCat("checksum mismatch: crc32 ", crc, ", metadata.json says ",
                                 entry["crc32"].get<std::string>(), " (corrupt data)"));
  }
  return bytes;
}

absl::StatusOr<json> ParseJson(const std::string& text, const std::string& path) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Fault(path, "not a valid JSON object");
  return j;
}

}  // namespace

absl::StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& step_dir) {
  // Fields of an unexpected JSON type throw inside nlohmann::json; they are
  // corrupt metadata like any other and must not escape as exceptions.
  try {
    return OpenUnchecked(step_dir);
  } catch (const json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", step_dir, ": malformed metadata.json or index.json: ", e.what()));
  }
}

absl::StatusOr<CheckpointReader> CheckpointReader::OpenUnchecked(const std::string& step_dir) {
  CheckpointReader r;
  r.dir_ = step_dir;
  const fs::path dir(step_dir);
  const std::string meta_path = (dir / kCheckpointMetadataFile).string();
  absl::StatusOr<std::string> meta_text = ReadFileBytes(meta_path);
  if (!meta_text.ok()) {
    return Fault(meta_path, "missing: the step was never committed or its metadata was lost");
  }
  absl::StatusOr<json> meta = ParseJson(*meta_text, meta_path);
  if (!meta.ok()) return meta.status();
  if (meta->value("format", "") != kCheckpointFormat || !(*meta)["version"].is_number_integer() ||
      (*meta)["version"].get<int>() != kCheckpointVersion) {
    return Fault(meta_path, absl::StrCat("not a ", kCheckpointFormat, " version ",
                                         kCheckpointVersion, " metadata file"));
  }
  if (!(*meta)["step"].is_number_integer() || !(*meta)["files"].is_object() ||
      !meta->contains("model")) {
    return Fault(meta_path, "missing step, files or model");
  }
  r.step_ = (*meta)["step"].get<int64_t>();
  absl::StatusOr<spec::ModelSpec> model = ModelSpecFromJson((*meta)["model"], meta_path);
  if (!model.ok()) return model.status();
  r.model_ = *model;
  r.state_ = meta->value("state", json::object());
  const json& files = (*meta)["files"];

  if (!files.contains(kCheckpointIndexFile)) return Fault(meta_path, "does not list index.json");
  const std::string index_path = (dir / kCheckpointIndexFile).string();
  absl::StatusOr<std::string> index_text = ReadVerified(index_path, files[kCheckpointIndexFile]);
  if (!index_text.ok()) return index_text.status();
  absl::StatusOr<json> index = ParseJson(*index_text, index_path);
  if (!index.ok()) return index.status();

  for (auto it = files.begin(); it != files.end(); ++it) {
    if (it.key() == kCheckpointIndexFile) continue;
    const fs::path path = dir / it.key();
    absl::StatusOr<std::string> bytes = ReadVerified(path, it.value());
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<SafetensorsFile> st = SafetensorsFile::Parse(std::move(*bytes), path.string());
    if (!st.ok()) return st.status();
    r.files_.emplace(it.key(), std::move(*st));
  }

  if (!(*index)["tensors"].is_object()) return Fault(index_path, "has no tensors map");
  for (auto it = (*index)["tensors"].begin(); it != (*index)["tensors"].end(); ++it) {
    const json& e = it.value();
    CheckpointTensorInfo info;
    info.name = it.key();
    if (!e.is_object() || !e["shape"].is_array() || !e["shards"].is_array() ||
        e["shards"].size() != 1 || !e["shards"][0].is_object()) {
      return Fault(index_path, absl::StrCat("tensor ", info.name,
                                            " lacks a shape or a single shard (unsupported layout)"));
    }
    info.group = e.value("group", "");
    for (const json& d : e["shape"]) info.shape.push_back(d.get<int64_t>());
    const json& shard = e["shards"][0];
    info.file = shard.value("file", "");
    info.key = shard.value("key", "");
    auto f = r.files_.find(info.file);
    if (f == r.files_.end()) {
      return Fault(index_path, absl::StrCat("tensor ", info.name, " is in file ", info.file,
                                            " which metadata.json does not list"));
    }
    const SafetensorsEntry* entry = f->second.Find(info.key);
    if (entry == nullptr || entry->shape != info.shape) {
      return Fault((dir / info.file).string(),
                   absl::StrCat("tensor ", info.key, entry == nullptr ? " missing" : " has shape " +
                                ShapeString(entry->shape), "; index.json says ",
                                ShapeString(info.shape)));
    }
    r.by_name_[info.name] = r.tensors_.size();
    r.tensors_.push_back(std::move(info));
  }
  return r;
}

const CheckpointTensorInfo* CheckpointReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

absl::Status CheckpointReader::CopyTo(const TensorView& dst) const {
  const CheckpointTensorInfo* info = Find(dst.name);
  if (info == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", dir_, ": model mismatch: tensor ", dst.name, " is not in index.json"));
  }
  if (info->shape != dst.shape) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", dir_, ": model mismatch: tensor ", dst.name, " has shape ",
        ShapeString(info->shape), " in the checkpoint but ", ShapeString(dst.shape), " in the model"));
  }
  return files_.at(info->file).CopyTo(info->key, dst);
}

absl::StatusOr<std::vector<float>> CheckpointReader::Values(const std::string& name) const {
  const CheckpointTensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir_, ": no tensor named ", name));
  }
  const SafetensorsFile& f = files_.at(info->file);
  return f.Values(*f.Find(info->key));
}

}  // namespace loom::engine
