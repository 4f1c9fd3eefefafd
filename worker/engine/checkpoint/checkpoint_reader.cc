#include "worker/engine/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/engine/checkpoint/checkpoint_checks.h"
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

absl::Status CheckEntry(const std::string& p, const json& entry) {
  if (!entry.is_object() || !entry.contains("bytes") || !entry.contains("crc32") ||
      !entry["bytes"].is_number_integer() || !entry["crc32"].is_string()) {
    return Fault(p, "metadata.json has no valid size and crc32 for it");
  }
  return absl::OkStatus();
}

absl::Status CheckSize(const std::string& p, int64_t size, const json& entry) {
  const int64_t want_bytes = entry["bytes"].get<int64_t>();
  if (size != want_bytes) {
    return Fault(p, absl::StrCat("size mismatch: ", size, " bytes, metadata.json says ",
                                 want_bytes, size < want_bytes ? " (truncated)" : ""));
  }
  return absl::OkStatus();
}

// The size of a file listed in metadata.json, checked against the record
// without reading the file.
absl::StatusOr<int64_t> ListedSize(const fs::path& path, const json& entry) {
  const std::string p = path.string();
  if (absl::Status s = CheckEntry(p, entry); !s.ok()) return s;
  absl::StatusOr<int64_t> size = RegularFileSize(p);
  if (!size.ok()) return Fault(p, "listed in metadata.json but missing or not a regular file");
  if (absl::Status s = CheckSize(p, *size, entry); !s.ok()) return s;
  return *size;
}

// Reads a file listed in metadata.json and checks its recorded size and CRC-32.
absl::StatusOr<std::string> ReadVerified(const fs::path& path, const json& entry) {
  const std::string p = path.string();
  if (absl::Status s = CheckEntry(p, entry); !s.ok()) return s;
  absl::StatusOr<std::string> bytes = ReadFileBytes(p);
  if (!bytes.ok()) return Fault(p, "listed in metadata.json but missing or not a regular file");
  if (absl::Status s = CheckSize(p, static_cast<int64_t>(bytes->size()), entry); !s.ok()) return s;
  const std::string crc = absl::StrFormat("%08x", Crc32(0, bytes->data(), bytes->size()));
  if (crc != entry["crc32"].get<std::string>()) {
    return Fault(p, absl::StrCat("checksum mismatch: crc32 ", crc, ", metadata.json says ",
                                 entry["crc32"].get<std::string>(), " (corrupt data)"));
  }
  return bytes;
}

// A name metadata.json lists must be a file of the step directory itself:
// not absolute, no directory part, not "." or "..".
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

absl::StatusOr<json> ParseJson(const std::string& text, const std::string& path) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Fault(path, "not a valid JSON object");
  return j;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Calls row(global_flat_begin, shard_flat_begin, length) for every run of the
// slice's last dimension, in order.
template <typename Row>
void ForEachRow(const std::vector<int64_t>& global, const CheckpointShardInfo& s, Row row) {
  const size_t dims = global.size();
  if (dims == 0) {
    row(0, 0, 1);
    return;
  }
  std::vector<int64_t> stride(dims, 1);
  for (size_t d = dims - 1; d > 0; --d) stride[d - 1] = stride[d] * global[d];
  const int64_t len = s.shape[dims - 1];
  const int64_t rows = len == 0 ? 0 : Numel(s.shape) / len;
  std::vector<int64_t> idx(dims, 0);  // over the slice's leading dimensions
  for (int64_t r = 0; r < rows; ++r) {
    int64_t g = s.offset[dims - 1];
    for (size_t d = 0; d + 1 < dims; ++d) g += (s.offset[d] + idx[d]) * stride[d];
    row(g, r * len, len);
    for (size_t d = dims - 1; d-- > 0;) {
      if (++idx[d] < s.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// Whether shard s holds any element of the rectangle dst (same rank).
bool RectOverlaps(const CheckpointShardInfo& s, const CheckpointRect& dst) {
  if (dst.offset.size() != s.offset.size() || dst.shape.size() != s.shape.size()) return false;
  for (size_t d = 0; d < s.offset.size(); ++d) {
    if (s.shape[d] == 0 || dst.shape[d] == 0) return false;
    if (s.offset[d] >= dst.offset[d] + dst.shape[d] || dst.offset[d] >= s.offset[d] + s.shape[d]) {
      return false;
    }
  }
  return true;
}

// Whether shard s of a tensor of shape `global` may hold an element of the
// flat range [lo, hi): its first and last elements bound its span.
bool FlatOverlaps(const std::vector<int64_t>& global, const CheckpointShardInfo& s, int64_t lo,
                  int64_t hi) {
  if (lo >= hi) return false;
  const size_t dims = global.size();
  if (dims == 0) return true;
  int64_t first = 0, last = 0, stride = 1;
  for (size_t d = dims; d-- > 0;) {
    if (s.shape[d] == 0) return false;
    first += s.offset[d] * stride;
    last += (s.offset[d] + s.shape[d] - 1) * stride;
    stride *= global[d];
  }
  return first < hi && lo <= last;
}

// Every shard inside the tensor, and together covering each element once.
// Sizes are checked before anything is allocated: the global shape comes from
// index.json alone, the shard shapes from safetensors headers whose data the
// files hold, so the shards' total bounds what may be allocated.
absl::Status CheckShardsTile(const CheckpointTensorInfo& t) {
  absl::StatusOr<int64_t> total_or = CheckedElementCount(t.shape, absl::StrCat("tensor ", t.name));
  if (!total_or.ok()) return total_or.status();
  const int64_t total = *total_or;
  int64_t stored = 0;
  for (const CheckpointShardInfo& s : t.shards) {
    if (s.offset.size() != t.shape.size() || s.shape.size() != t.shape.size()) {
      return absl::DataLossError(absl::StrCat("tensor ", t.name, ": shard ", s.key,
                                              " has the wrong number of dimensions"));
    }
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (!FitsWithin(s.offset[d], s.shape[d], t.shape[d])) {
        return absl::DataLossError(absl::StrCat("tensor ", t.name, ": shard ", s.key, " at ",
                                                ShapeString(s.offset), " of shape ",
                                                ShapeString(s.shape), " lies outside ",
                                                ShapeString(t.shape)));
      }
    }
    absl::StatusOr<int64_t> n = CheckedElementCount(s.shape, absl::StrCat("tensor ", t.name));
    if (!n.ok()) return n.status();
    stored += *n;  // each shard is backed by its file's bytes: no overflow
  }
  if (stored != total) {
    return absl::DataLossError(absl::StrCat("tensor ", t.name, ": shards hold ", stored,
                                            " elements but its shape ", ShapeString(t.shape),
                                            " has ", total));
  }
  std::vector<bool> seen(static_cast<size_t>(total), false);
  int64_t covered = 0;
  for (const CheckpointShardInfo& s : t.shards) {
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (!FitsWithin(s.offset[d], s.shape[d], t.shape[d])) {
        return absl::DataLossError(absl::StrCat("tensor ", t.name, ": shard ", s.key, " at ",
                                                ShapeString(s.offset), " of shape ",
                                                ShapeString(s.shape), " lies outside ",
                                                ShapeString(t.shape)));
      }
    }
    bool overlap = false;
    ForEachRow(t.shape, s, [&](int64_t g, int64_t, int64_t len) {
      for (int64_t i = 0; i < len; ++i) {
        overlap = overlap || seen[static_cast<size_t>(g + i)];
        seen[static_cast<size_t>(g + i)] = true;
      }
    });
    if (overlap) {
      return absl::DataLossError(absl::StrCat("tensor ", t.name, ": shard ", s.key,
                                              " overlaps another shard"));
    }
    covered += Numel(s.shape);
  }
  if (covered != total) {
    return absl::DataLossError(absl::StrCat("tensor ", t.name, ": shards cover ", covered,
                                            " of ", total, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& step_dir,
                                                        CheckpointReadMode mode) {
  // Fields of an unexpected JSON type throw inside nlohmann::json; they are
  // corrupt metadata like any other and must not escape as exceptions.
  try {
    return OpenUnchecked(step_dir, mode);
  } catch (const json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", step_dir, ": malformed metadata.json or index.json: ", e.what()));
  }
}

absl::StatusOr<CheckpointReader> CheckpointReader::OpenUnchecked(const std::string& step_dir,
                                                                 CheckpointReadMode mode) {
  CheckpointReader r;
  r.dir_ = step_dir;
  const fs::path dir(step_dir);
  const std::string meta_path = (dir / kCheckpointMetadataFile).string();
  absl::StatusOr<std::string> meta_text = ReadFileBytes(meta_path, kMaxCheckpointMetadataBytes);
  if (!meta_text.ok()) {
    return Fault(meta_path, "missing: the step was never committed or its metadata was lost");
  }
  absl::StatusOr<json> meta = ParseJson(*meta_text, meta_path);
  if (!meta.ok()) return meta.status();
  if (meta->value("format", "") != kCheckpointFormat || !(*meta)["version"].is_number_integer()) {
    return Fault(meta_path, absl::StrCat("not a ", kCheckpointFormat, " metadata file"));
  }
  if (const int64_t version = (*meta)["version"].get<int64_t>();
      version < kOldestReadableCheckpointVersion || version > kCheckpointVersion) {
    return Fault(meta_path, absl::StrCat(kCheckpointFormat, " version ", version,
                                         " cannot be read: this build reads versions ",
                                         kOldestReadableCheckpointVersion, " to ",
                                         kCheckpointVersion));
  }
  if (!(*meta)["step"].is_number_integer() || !(*meta)["files"].is_object() ||
      !meta->contains("model")) {
    return Fault(meta_path, "missing step, files or model");
  }
  r.step_ = (*meta)["step"].get<int64_t>();
  absl::StatusOr<spec::ModelSpec> model = ModelSpecFromJson((*meta)["model"], meta_path);
  if (!model.ok()) return model.status();
  if (absl::Status s = CheckCheckpointModel(*model, meta_path); !s.ok()) return s;
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
    if (!IsPlainFileName(it.key())) {
      return Fault(meta_path, "lists a file that is not a plain name in the step directory");
    }
    if (it.key() == kCheckpointIndexFile) continue;
    const fs::path path = dir / it.key();
    r.entries_[it.key()] = it.value();
    if (mode == CheckpointReadMode::kOnDemand) {
      // Size and header now; the data and its CRC when a copy needs them.
      absl::StatusOr<int64_t> size = ListedSize(path, it.value());
      if (!size.ok()) return size.status();
      absl::StatusOr<SafetensorsFile> st = SafetensorsFile::ReadHeader(path.string(), *size);
      if (!st.ok()) return st.status();
      r.files_.emplace(it.key(), std::move(*st));
      continue;
    }
    absl::StatusOr<std::string> bytes = ReadVerified(path, it.value());
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<SafetensorsFile> st = SafetensorsFile::Parse(std::move(*bytes), path.string());
    if (!st.ok()) return st.status();
    r.files_.emplace(it.key(), std::move(*st));
    r.loaded_.insert(it.key());
    r.files_read_.push_back(it.key());
  }

  if (!(*index)["tensors"].is_object()) return Fault(index_path, "has no tensors map");
  for (auto it = (*index)["tensors"].begin(); it != (*index)["tensors"].end(); ++it) {
    const json& e = it.value();
    CheckpointTensorInfo info;
    info.name = it.key();
    if (!e.is_object() || !e["shape"].is_array() || !e["shards"].is_array() ||
        e["shards"].empty()) {
      return Fault(index_path, absl::StrCat("tensor ", info.name, " lacks a shape or shards"));
    }
    info.group = e.value("group", "");
    for (const json& d : e["shape"]) info.shape.push_back(d.get<int64_t>());
    for (const json& shard : e["shards"]) {
      if (!shard.is_object()) {
        return Fault(index_path, absl::StrCat("tensor ", info.name, " has a malformed shard"));
      }
      CheckpointShardInfo si;
      si.file = shard.value("file", "");
      si.key = shard.value("key", "");
      if (shard.contains("offset")) {
        for (const json& d : shard["offset"]) si.offset.push_back(d.get<int64_t>());
      } else {
        si.offset.assign(info.shape.size(), 0);
      }
      if (shard.contains("shape")) {
        for (const json& d : shard["shape"]) si.shape.push_back(d.get<int64_t>());
      } else {
        si.shape = info.shape;
      }
      auto f = r.files_.find(si.file);
      if (f == r.files_.end()) {
        return Fault(index_path, absl::StrCat("tensor ", info.name, " is in file ", si.file,
                                              " which metadata.json does not list"));
      }
      const SafetensorsEntry* entry = f->second.Find(si.key);
      if (entry == nullptr || entry->shape != si.shape) {
        return Fault((dir / si.file).string(),
                     absl::StrCat("tensor ", si.key, entry == nullptr ? " missing" : " has shape " +
                                  ShapeString(entry->shape), "; index.json says ",
                                  ShapeString(si.shape)));
      }
      info.shards.push_back(std::move(si));
    }
    if (absl::Status s = CheckShardsTile(info); !s.ok()) {
      return Fault(index_path, std::string(s.message()));
    }
    info.file = info.shards[0].file;
    info.key = info.shards[0].key;
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
  return CopyTo(FlatSlice{dst.name, dst.shape, 0, Numel(dst.shape), dst.data});
}

absl::Status CheckpointReader::CopyTo(const FlatSlice& dst) const {
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
  const int64_t lo = dst.begin;
  if (!FitsWithin(dst.begin, dst.count, Numel(info->shape))) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", dir_, ": ", dst.count,
                                                   " elements from ", lo,
                                                   " lie outside tensor ", dst.name));
  }
  const int64_t hi = lo + dst.count;
  for (const CheckpointShardInfo& s : info->shards) {
    if (!FlatOverlaps(info->shape, s, lo, hi)) continue;
    absl::StatusOr<const SafetensorsFile*> loaded = Load(s.file);
    if (!loaded.ok()) return loaded.status();
    const SafetensorsFile& f = **loaded;
    const SafetensorsEntry* e = f.Find(s.key);
    ForEachRow(info->shape, s, [&](int64_t g, int64_t local, int64_t len) {
      const int64_t a = std::max(lo, g), z = std::min(hi, g + len);
      if (a < z) f.CopyElements(*e, local + (a - g), z - a, dst.data + (a - lo));
    });
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::CopyTo(const CheckpointRect& dst) const {
  const CheckpointTensorInfo* info = Find(dst.name);
  if (info == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", dir_, ": model mismatch: tensor ", dst.name, " is not in index.json"));
  }
  if (info->shape != dst.global_shape) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", dir_, ": model mismatch: tensor ", dst.name, " has shape ",
        ShapeString(info->shape), " in the checkpoint but ", ShapeString(dst.global_shape),
        " in the model"));
  }
  const size_t dims = info->shape.size();
  if (dst.offset.size() != dims || dst.shape.size() != dims) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", dir_, ": a slice of ", dst.name,
                                                   " has the wrong number of dimensions"));
  }
  for (size_t d = 0; d < dims; ++d) {
    if (!FitsWithin(dst.offset[d], dst.shape[d], info->shape[d])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", dir_, ": the slice at ", ShapeString(dst.offset), " of shape ",
          ShapeString(dst.shape), " lies outside tensor ", dst.name, " ", ShapeString(info->shape)));
    }
  }
  if (dims == 0) return CopyTo(FlatSlice{dst.name, info->shape, 0, 1, dst.data});
  // Every stored row (a run of the last dimension) that meets the slice is
  // copied into the slice's row-major place.
  std::vector<int64_t> stride(dims, 1), dst_stride(dims, 1);
  for (size_t d = dims - 1; d > 0; --d) {
    stride[d - 1] = stride[d] * info->shape[d];
    dst_stride[d - 1] = dst_stride[d] * dst.shape[d];
  }
  const int64_t lo = dst.offset[dims - 1], hi = lo + dst.shape[dims - 1];
  for (const CheckpointShardInfo& s : info->shards) {
    if (!RectOverlaps(s, dst)) continue;
    absl::StatusOr<const SafetensorsFile*> loaded = Load(s.file);
    if (!loaded.ok()) return loaded.status();
    const SafetensorsFile& f = **loaded;
    const SafetensorsEntry* e = f.Find(s.key);
    ForEachRow(info->shape, s, [&](int64_t g, int64_t local, int64_t len) {
      int64_t at = 0;  // the row's place in dst, without the last dimension
      int64_t rest = g;
      for (size_t d = 0; d + 1 < dims; ++d) {
        const int64_t i = rest / stride[d] - dst.offset[d];
        rest %= stride[d];
        if (i < 0 || i >= dst.shape[d]) return;
        at += i * dst_stride[d];
      }
      const int64_t a = std::max(lo, rest), z = std::min(hi, rest + len);
      if (a < z) f.CopyElements(*e, local + (a - rest), z - a, dst.data + at + (a - lo));
    });
  }
  return absl::OkStatus();
}

absl::StatusOr<const SafetensorsFile*> CheckpointReader::Load(const std::string& file) const {
  auto it = files_.find(file);
  if (it == files_.end()) {
    return absl::InternalError(absl::StrCat("checkpoint ", dir_, ": no file ", file));
  }
  if (loaded_.count(file) != 0) return &it->second;
  const fs::path path = fs::path(dir_) / file;
  absl::StatusOr<std::string> bytes = ReadVerified(path, entries_.at(file));
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<SafetensorsFile> st = SafetensorsFile::Parse(std::move(*bytes), path.string());
  if (!st.ok()) return st.status();
  // The index was checked against the header read at open; the file must
  // still hold the same tensors at the same places.
  for (const SafetensorsEntry& e : it->second.entries()) {
    const SafetensorsEntry* now = st->Find(e.name);
    if (now == nullptr || now->shape != e.shape || now->begin != e.begin || now->end != e.end) {
      return Fault(path.string(), absl::StrCat("tensor ", e.name,
                                               " changed since the step was opened"));
    }
  }
  it->second = *std::move(st);
  loaded_.insert(file);
  if (verified_.count(file) == 0) files_read_.push_back(file);
  return &it->second;
}

template <typename Overlaps>
absl::Status CheckpointReader::FetchShards(const std::string& name, Overlaps overlaps) const {
  const CheckpointTensorInfo* info = Find(name);
  if (info == nullptr) return absl::OkStatus();  // the copy names the mismatch
  for (const CheckpointShardInfo& s : info->shards) {
    if (!overlaps(*info, s)) continue;
    if (absl::StatusOr<const SafetensorsFile*> f = Load(s.file); !f.ok()) return f.status();
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::Fetch(const FlatSlice& dst) const {
  return FetchShards(dst.name, [&](const CheckpointTensorInfo& info, const CheckpointShardInfo& s) {
    return info.shape == dst.shape && FlatOverlaps(info.shape, s, dst.begin, dst.begin + dst.count);
  });
}

absl::Status CheckpointReader::Fetch(const CheckpointRect& dst) const {
  return FetchShards(dst.name, [&](const CheckpointTensorInfo&, const CheckpointShardInfo& s) {
    return RectOverlaps(s, dst);
  });
}

absl::Status CheckpointReader::VerifyAllFiles() const {
  for (const auto& [file, entry] : entries_) {
    if (loaded_.count(file) != 0 || verified_.count(file) != 0) continue;
    const fs::path path = fs::path(dir_) / file;
    absl::StatusOr<std::string> bytes = ReadVerified(path, entry);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<SafetensorsFile> st = SafetensorsFile::Parse(std::move(*bytes), path.string());
    if (!st.ok()) return st.status();
    verified_.insert(file);
    files_read_.push_back(file);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CheckpointReader::Values(const std::string& name) const {
  const CheckpointTensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir_, ": no tensor named ", name));
  }
  std::vector<float> out(static_cast<size_t>(Numel(info->shape)));
  if (absl::Status s = CopyTo(FlatSlice{name, info->shape, 0, Numel(info->shape), out.data()});
      !s.ok()) {
    return s;
  }
  return out;
}

}  // namespace loom::engine
