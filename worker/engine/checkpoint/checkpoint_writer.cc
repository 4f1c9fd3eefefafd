#include "worker/engine/checkpoint/checkpoint_writer.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/engine/checkpoint/checkpoint_format.h"
#include "worker/engine/checkpoint/commit_faults.h"
#include "worker/engine/checkpoint/durable_file.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

absl::Status FsError(const std::string& what, const std::error_code& ec) {
  return absl::InternalError(absl::StrCat("checkpoint: ", what, ": ", ec.message()));
}

json FileEntry(const FileDigest& d) {
  return {{"bytes", d.bytes}, {"crc32", absl::StrFormat("%08x", d.crc32)}};
}

json BuildIndex(const CheckpointContent& content) {
  json tensors = json::object();
  for (const CheckpointFile& f : content.files) {
    for (size_t i = 0; i < f.tensors.size(); ++i) {
      const TensorView& t = f.tensors[i];
      const bool sliced = i < f.slices.size();
      const std::string& global = sliced ? f.slices[i].tensor : t.name;
      const std::vector<int64_t>& shape = sliced ? f.slices[i].global_shape : t.shape;
      json shard = {{"file", f.name}, {"key", t.name},
                    {"offset", sliced ? f.slices[i].offset : std::vector<int64_t>(t.shape.size(), 0)},
                    {"shape", t.shape}};
      if (!tensors.contains(global)) {
        tensors[global] = {{"dtype", "F32"}, {"shape", shape}, {"group", f.group},
                           {"shards", json::array()}};
      }
      tensors[global]["shards"].push_back(shard);
    }
  }
  return {{"format", kCheckpointFormat}, {"version", kCheckpointVersion}, {"tensors", tensors}};
}

// Keeps the newest `keep` committed steps; removes older step directories and
// temporaries left by crashed writers.
void Prune(const std::string& root, int64_t keep) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".step_", 0) == 0) fs::remove_all(e.path(), ec);
  }
  if (keep <= 0) return;
  int64_t committed = 0;
  for (const auto& [step, dir] : ListStepDirs(root)) {
    if (committed >= keep) {
      fs::remove_all(dir, ec);
    } else if (fs::exists(fs::path(dir) / kCheckpointMetadataFile, ec)) {
      ++committed;
    }
  }
}

}  // namespace

std::string CheckpointTempDir(const std::string& root, int64_t step, int64_t tag) {
  return (fs::path(root) / absl::StrCat(".", StepDirName(step), ".tmp-", tag)).string();
}

absl::StatusOr<std::string> BeginCheckpointStep(const std::string& root, int64_t step,
                                                int64_t tag) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return FsError(absl::StrCat("create ", root), ec);
  const std::string tmp_dir = CheckpointTempDir(root, step, tag);
  fs::remove_all(tmp_dir, ec);
  fs::create_directory(tmp_dir, ec);
  if (ec) return FsError(absl::StrCat("create ", tmp_dir), ec);
  return tmp_dir;
}

absl::StatusOr<FileDigest> WriteCheckpointFile(const std::string& temp_dir,
                                               const CheckpointFile& f) {
  return WriteSafetensors((fs::path(temp_dir) / f.name).string(), f.tensors,
                          {{"format", "pt"}, {"loom.group", f.group}});
}

absl::StatusOr<std::string> CommitCheckpointStep(const std::string& root,
                                                 const std::string& temp_dir,
                                                 const CheckpointContent& content,
                                                 const std::vector<FileDigest>& digests,
                                                 int64_t keep) {
  if (digests.size() != content.files.size()) {
    return absl::InvalidArgumentError("checkpoint: one digest per file is needed");
  }
  std::error_code ec;
  const fs::path tmp_dir(temp_dir);
  const std::string name = StepDirName(content.step);
  const fs::path final_dir = fs::path(root) / name;
  if (!content.files.empty()) {
    RunCommitFaultHook(CommitPoint::kFilesWritten, content.step,
                       (tmp_dir / content.files.front().name).string());
  }
  json files = json::object();
  std::set<std::string> seen;
  for (size_t i = 0; i < content.files.size(); ++i) {
    const CheckpointFile& f = content.files[i];
    if (!seen.insert(f.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: file ", f.name, " given twice"));
    }
    files[f.name] = FileEntry(digests[i]);
  }
  absl::StatusOr<FileDigest> index =
      WriteFileDurably((tmp_dir / kCheckpointIndexFile).string(), BuildIndex(content).dump(1));
  if (!index.ok()) return index.status();
  files[kCheckpointIndexFile] = FileEntry(*index);

  RunCommitFaultHook(CommitPoint::kBeforeMetadata, content.step, tmp_dir.string());
  // The metadata is the commit record inside the directory: written last.
  json metadata = {{"format", kCheckpointFormat},     {"version", kCheckpointVersion},
                   {"step", content.step},            {"model", ModelSpecToJson(content.model)},
                   {"state", content.state},          {"files", files}};
  absl::StatusOr<FileDigest> meta =
      WriteFileDurably((tmp_dir / kCheckpointMetadataFile).string(), metadata.dump(1));
  if (!meta.ok()) return meta.status();
  if (absl::Status s = FsyncDirectory(tmp_dir.string()); !s.ok()) return s;
  RunCommitFaultHook(CommitPoint::kBeforeRename, content.step, tmp_dir.string());

  // rename() cannot replace a non-empty directory: move an existing step of
  // the same number aside first (a refused step being re-written after a
  // fallback), then delete it once the new one is in place.
  const fs::path old_dir = fs::path(root) / absl::StrCat(".", name, ".old-", ::getpid());
  const bool replacing = fs::exists(final_dir, ec);
  if (replacing) {
    fs::rename(final_dir, old_dir, ec);
    if (ec) return FsError(absl::StrCat("move aside ", final_dir.string()), ec);
  }
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) return FsError(absl::StrCat("rename ", tmp_dir.string(), " to ", final_dir.string()), ec);
  if (absl::Status s = FsyncDirectory(root); !s.ok()) return s;
  if (replacing) fs::remove_all(old_dir, ec);
  Prune(root, keep);
  return final_dir.string();
}

json DescribeCheckpointFile(const CheckpointFile& f) {
  json tensors = json::array(), slices = json::array();
  for (const TensorView& t : f.tensors) tensors.push_back({{"key", t.name}, {"shape", t.shape}});
  for (const CheckpointSlice& s : f.slices) {
    slices.push_back({{"tensor", s.tensor}, {"global_shape", s.global_shape}, {"offset", s.offset}});
  }
  return {{"name", f.name}, {"group", f.group}, {"tensors", tensors}, {"slices", slices}};
}

CheckpointFile CheckpointFileFromDescription(const json& f) {
  CheckpointFile file{f.at("name").get<std::string>(), f.at("group").get<std::string>(), {}, {}};
  for (const json& t : f.at("tensors")) {
    file.tensors.push_back(
        {t.at("key").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(), nullptr});
  }
  for (const json& s : f.at("slices")) {
    file.slices.push_back({s.at("tensor").get<std::string>(),
                           s.at("global_shape").get<std::vector<int64_t>>(),
                           s.at("offset").get<std::vector<int64_t>>()});
  }
  return file;
}

void EncodeFileDigest(const FileDigest& digest, int32_t* slot) {
  const uint64_t bytes = static_cast<uint64_t>(digest.bytes);
  slot[0] = 1;
  slot[1] = static_cast<int32_t>(static_cast<uint32_t>(bytes & 0xffffffffu));
  slot[2] = static_cast<int32_t>(static_cast<uint32_t>(bytes >> 32));
  slot[3] = static_cast<int32_t>(digest.crc32);
}

FileDigest DecodeFileDigest(const int32_t* slot) {
  FileDigest d;
  const uint64_t lo = static_cast<uint32_t>(slot[1]), hi = static_cast<uint32_t>(slot[2]);
  d.bytes = static_cast<int64_t>(lo | (hi << 32));
  d.crc32 = static_cast<uint32_t>(slot[3]);
  return d;
}

}  // namespace loom::engine
