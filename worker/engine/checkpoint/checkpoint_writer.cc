#include "worker/engine/checkpoint/checkpoint_writer.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/engine/checkpoint/checkpoint_format.h"
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
    for (const TensorView& t : f.tensors) {
      // One shard covering the whole tensor; sharded layouts list several,
      // each with the offset of its slice in the global tensor.
      json shard = {{"file", f.name}, {"key", t.name},
                    {"offset", std::vector<int64_t>(t.shape.size(), 0)}, {"shape", t.shape}};
      tensors[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"group", f.group},
                         {"shards", json::array({shard})}};
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

absl::StatusOr<std::string> CommitCheckpoint(const std::string& root,
                                             const CheckpointContent& content, int64_t keep) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return FsError(absl::StrCat("create ", root), ec);
  const std::string name = StepDirName(content.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp_dir = fs::path(root) / absl::StrCat(".", name, ".tmp-", ::getpid());
  fs::remove_all(tmp_dir, ec);
  fs::create_directory(tmp_dir, ec);
  if (ec) return FsError(absl::StrCat("create ", tmp_dir.string()), ec);

  json files = json::object();
  std::set<std::string> seen;
  for (const CheckpointFile& f : content.files) {
    if (!seen.insert(f.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: file ", f.name, " given twice"));
    }
    absl::StatusOr<FileDigest> d =
        WriteSafetensors((tmp_dir / f.name).string(), f.tensors,
                         {{"format", "pt"}, {"loom.group", f.group}});
    if (!d.ok()) return d.status();
    files[f.name] = FileEntry(*d);
  }
  absl::StatusOr<FileDigest> index =
      WriteFileDurably((tmp_dir / kCheckpointIndexFile).string(), BuildIndex(content).dump(1));
  if (!index.ok()) return index.status();
  files[kCheckpointIndexFile] = FileEntry(*index);

  // The metadata is the commit record inside the directory: written last.
  json metadata = {{"format", kCheckpointFormat},     {"version", kCheckpointVersion},
                   {"step", content.step},            {"model", ModelSpecToJson(content.model)},
                   {"state", content.state},          {"files", files}};
  absl::StatusOr<FileDigest> meta =
      WriteFileDurably((tmp_dir / kCheckpointMetadataFile).string(), metadata.dump(1));
  if (!meta.ok()) return meta.status();
  if (absl::Status s = FsyncDirectory(tmp_dir.string()); !s.ok()) return s;

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

}  // namespace loom::engine
