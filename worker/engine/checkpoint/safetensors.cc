#include "worker/engine/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/checkpoint_checks.h"

namespace loom::engine {
namespace {

using nlohmann::json;

absl::Status Fault(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat("safetensors file ", path, ": ", what));
}

absl::Status ParseEntry(const std::string& path, const std::string& name, const json& v,
                        SafetensorsEntry* e) {
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
      !v.contains("data_offsets")) {
    return Fault(path, absl::StrCat("corrupt header: tensor ", name,
                                    " lacks dtype, shape or data_offsets"));
  }
  const json& dtype = v["dtype"];
  const json& shape = v["shape"];
  const json& offsets = v["data_offsets"];
  if (!dtype.is_string() || !shape.is_array() || !offsets.is_array() || offsets.size() != 2) {
    return Fault(path, absl::StrCat("corrupt header: tensor ", name, " has malformed fields"));
  }
  e->name = name;
  e->dtype = dtype.get<std::string>();
  if (e->dtype != "F32") {
    return Fault(path, absl::StrCat("tensor ", name, " has dtype ", e->dtype,
                                    "; Loom reads F32 only"));
  }
  for (const json& d : shape) {
    if (!d.is_number_unsigned()) {
      return Fault(path, absl::StrCat("corrupt header: tensor ", name, " has a bad dimension"));
    }
    e->shape.push_back(d.get<int64_t>());
  }
  if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
    return Fault(path, absl::StrCat("corrupt header: tensor ", name, " has bad data_offsets"));
  }
  e->begin = offsets[0].get<int64_t>();
  e->end = offsets[1].get<int64_t>();
  absl::StatusOr<int64_t> numel =
      CheckedElementCount(e->shape, absl::StrCat("safetensors file ", path, ": tensor ", name));
  if (!numel.ok()) return numel.status();
  if (e->begin < 0 || e->end < e->begin || e->end - e->begin != *numel * 4) {
    return Fault(path, absl::StrCat("tensor ", name, " data_offsets [", e->begin, ", ", e->end,
                                    ") do not hold shape ", ShapeString(e->shape), " of F32"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<FileDigest> WriteSafetensors(const std::string& path,
                                            const std::vector<TensorView>& tensors,
                                            const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (header.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": duplicate tensor name ", t.name));
    }
    const int64_t bytes = t.numel() * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the format allows.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(header_len >> (8 * i));

  absl::StatusOr<DurableFile> file = DurableFile::Create(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Write(len_bytes, 8); !s.ok()) return s;
  if (absl::Status s = file->Write(text.data(), text.size()); !s.ok()) return s;
  for (const TensorView& t : tensors) {
    if (absl::Status s = file->Write(t.data, static_cast<size_t>(t.numel()) * 4); !s.ok()) return s;
  }
  return file->Close();
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return bytes.status();
  return Parse(std::move(*bytes), path);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes, std::string path) {
  SafetensorsFile f;
  f.path_ = std::move(path);
  f.bytes_ = std::move(bytes);
  if (absl::Status s = f.ParseHeader(static_cast<int64_t>(f.bytes_.size())); !s.ok()) return s;
  return f;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::ReadHeader(const std::string& path,
                                                            int64_t file_size) {
  SafetensorsFile f;
  f.path_ = path;
  absl::StatusOr<std::string> prefix = ReadFilePrefix(path, 8);
  if (!prefix.ok()) return prefix.status();
  uint64_t header_len = 0;
  for (int i = 0; i < 8 && i < static_cast<int>(prefix->size()); ++i) {
    header_len |= static_cast<uint64_t>(static_cast<unsigned char>((*prefix)[i])) << (8 * i);
  }
  // A header length beyond the file is refused by ParseHeader from the
  // 8 bytes alone; only a length that fits is read.
  if (prefix->size() == 8 && file_size >= 8 &&
      header_len <= static_cast<uint64_t>(file_size - 8)) {
    prefix = ReadFilePrefix(path, 8 + static_cast<int64_t>(header_len));
    if (!prefix.ok()) return prefix.status();
  }
  f.bytes_ = *std::move(prefix);
  if (absl::Status s = f.ParseHeader(file_size); !s.ok()) return s;
  return f;
}

absl::Status SafetensorsFile::ParseHeader(int64_t size) {
  SafetensorsFile& f = *this;
  if (size < 8 || f.bytes_.size() < 8) return Fault(f.path_, absl::StrCat("truncated: ", size, " bytes, no header length"));
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) {
    header_len |= static_cast<uint64_t>(static_cast<unsigned char>(f.bytes_[i])) << (8 * i);
  }
  if (header_len > static_cast<uint64_t>(size - 8) ||
      static_cast<int64_t>(f.bytes_.size()) < 8 + static_cast<int64_t>(header_len)) {
    return Fault(f.path_, absl::StrCat("corrupt header: header length ", header_len,
                                       " exceeds the file's ", size - 8, " remaining bytes"));
  }
  f.data_start_ = 8 + static_cast<int64_t>(header_len);
  json header = json::parse(f.bytes_.begin() + 8, f.bytes_.begin() + f.data_start_, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Fault(f.path_, "corrupt header: not a JSON object");
  }
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Fault(f.path_, "corrupt header: __metadata__ not a map");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return Fault(f.path_, "corrupt header: __metadata__ values must be strings");
        }
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    if (absl::Status s = ParseEntry(f.path_, it.key(), it.value(), &e); !s.ok()) return s;
    f.entries_.push_back(std::move(e));
  }
  std::sort(f.entries_.begin(), f.entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  // The tensors must tile the data section exactly: no gaps, no overlap.
  const int64_t data_size = size - f.data_start_;
  int64_t expect = 0;
  for (const SafetensorsEntry& e : f.entries_) {
    if (e.begin != expect) {
      return Fault(f.path_, absl::StrCat("corrupt header: tensor ", e.name, " starts at ",
                                         e.begin, ", expected ", expect));
    }
    if (e.end > data_size) {
      return Fault(f.path_, absl::StrCat("truncated: tensor ", e.name, " ends at byte ", e.end,
                                         " but the data section has ", data_size, " bytes"));
    }
    expect = e.end;
  }
  if (expect != data_size) {
    return Fault(f.path_, absl::StrCat("size mismatch: tensors cover ", expect,
                                       " bytes but the data section has ", data_size));
  }
  for (size_t i = 0; i < f.entries_.size(); ++i) f.by_name_[f.entries_[i].name] = i;
  return absl::OkStatus();
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

absl::Status SafetensorsFile::CopyTo(const std::string& name, const TensorView& dst) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) return Fault(path_, absl::StrCat("no tensor named ", name));
  if (e->shape != dst.shape) {
    return absl::FailedPreconditionError(
        absl::StrCat("safetensors file ", path_, ": tensor ", name, " has shape ",
                     ShapeString(e->shape), " but the model expects ", ShapeString(dst.shape)));
  }
  std::memcpy(dst.data, bytes_.data() + data_start_ + e->begin, static_cast<size_t>(e->end - e->begin));
  return absl::OkStatus();
}

std::vector<float> SafetensorsFile::Values(const SafetensorsEntry& e) const {
  std::vector<float> out(static_cast<size_t>((e.end - e.begin) / 4));
  std::memcpy(out.data(), bytes_.data() + data_start_ + e.begin, static_cast<size_t>(e.end - e.begin));
  return out;
}

void SafetensorsFile::CopyElements(const SafetensorsEntry& e, int64_t first, int64_t count,
                                   float* out) const {
  if (count <= 0) return;
  std::memcpy(out, bytes_.data() + data_start_ + e.begin + first * 4, static_cast<size_t>(count) * 4);
}

}  // namespace loom::engine
