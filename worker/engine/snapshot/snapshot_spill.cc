#include "worker/engine/snapshot/snapshot_spill.h"

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/engine/checkpoint/checkpoint_format.h"
#include "worker/engine/checkpoint/crc32.h"
#include "worker/engine/checkpoint/durable_file.h"
#include "worker/engine/data_parallel/flat_partition.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kMoeBiasPrefix[] = "moe_bias.";  // training_loop_snapshot.cc's pieces
// A description is a list of tensor names and shapes: far below this.
constexpr int64_t kMaxDescriptionBytes = int64_t{256} << 20;

std::string DescriptionName(int rank) { return absl::StrFormat("spilled-r%05d.json", rank); }
std::string FileName(const std::string& group, int rank) {
  return absl::StrFormat("%s-r%05d.safetensors", group, rank);
}

bool IsMoeBias(const SnapshotPiece& p) { return p.name.rfind(kMoeBiasPrefix, 0) == 0; }

// The checkpoint writers' description of the file, with its digest.
json DescribeFile(const CheckpointFile& f, const FileDigest& d) {
  json out = DescribeCheckpointFile(f);
  out["bytes"] = d.bytes;
  out["crc32"] = d.crc32;
  return out;
}

}  // namespace

std::string SpillDir(const std::string& root, int64_t step, int attempt) {
  // ".step_*": what Prune removes as a temporary left behind.
  return (fs::path(root) / absl::StrCat(".", StepDirName(step), ".spill-", attempt)).string();
}

int64_t NewestCommittedStep(const std::string& root) {
  std::optional<std::string> dir = NewestCommittedStepDir(root);
  if (!dir.has_value()) return -1;
  std::optional<int64_t> step = ParseStepDirName(fs::path(*dir).filename().string());
  return step.value_or(-1);
}

std::string FormatDigest(const FileDigest& d) { return absl::StrCat(d.bytes, ":", d.crc32); }

absl::StatusOr<FileDigest> ParseDigest(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  FileDigest d;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &d.bytes) || d.bytes < 0 ||
      !absl::SimpleAtoi(parts[1], &d.crc32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("spill: '", text, "' is not a digest (<bytes>:<crc32>)"));
  }
  return d;
}

absl::StatusOr<FileDigest> WriteSpilledRank(const std::string& dir, const Snapshot& snapshot) {
  if (snapshot.empty() || !snapshot.borrowed().empty()) {
    return absl::FailedPreconditionError(
        "spill: the snapshot is empty or a copy whose borrowed pieces were not filled");
  }
  const SnapshotManifest& m = snapshot.manifest();
  const int rank = m.owner.rank;
  CheckpointFile model{FileName("model", rank), "model", {}, {}};
  CheckpointFile optimizer{FileName("optimizer", rank), "optimizer", {}, {}};
  json moe_bias = json::object();
  // The writer only reads the floats; TensorView's pointer is not const.
  float* data = const_cast<float*>(snapshot.data());
  for (const SnapshotPiece& p : m.pieces) {
    if (IsMoeBias(p)) {
      const float* b = data + p.offset;
      moe_bias[p.name.substr(sizeof(kMoeBiasPrefix) - 1)] = std::vector<float>(b, b + p.count);
      continue;
    }
    if (!p.write || p.count == 0) continue;
    CheckpointFile& file = p.name.rfind("optimizer.", 0) == 0 ? optimizer : model;
    for (const RectSlice& r :
         ShardRangeToGlobalSlices(p.shape, p.shard_axis, p.shard_offset, p.begin, p.count)) {
      file.tensors.push_back({absl::StrCat(p.name, "@", absl::StrJoin(r.offset, ",")), r.shape,
                              data + p.offset + (r.flat_begin - p.begin)});
      file.slices.push_back({p.name, p.global_shape, r.offset});
    }
  }
  json files = json::array();
  for (const CheckpointFile* f : {&model, &optimizer}) {
    if (f->tensors.empty()) continue;
    absl::StatusOr<FileDigest> d = WriteCheckpointFile(dir, *f);
    if (!d.ok()) return d.status();
    files.push_back(DescribeFile(*f, *d));
  }
  const json description = {{"rank", rank}, {"step", m.step}, {"files", files},
                            {"moe_bias", moe_bias}};
  return WriteFileDurably((fs::path(dir) / DescriptionName(rank)).string(), description.dump());
}

absl::StatusOr<SpilledRank> ReadSpilledRank(const std::string& dir, int rank,
                                            const FileDigest& expected) {
  const std::string path = (fs::path(dir) / DescriptionName(rank)).string();
  absl::StatusOr<std::string> text = ReadFileBytes(path, kMaxDescriptionBytes);
  if (!text.ok()) return text.status();
  const uint32_t crc = Crc32(0, text->data(), text->size());
  if (static_cast<int64_t>(text->size()) != expected.bytes || crc != expected.crc32) {
    return absl::DataLossError(absl::StrCat("spill: ", path, " is ", text->size(),
                                            " bytes with CRC ", crc, ", its writer wrote ",
                                            expected.bytes, " bytes with CRC ", expected.crc32));
  }
  SpilledRank out;
  try {
    const json j = json::parse(*text);
    out.rank = j.at("rank").get<int>();
    if (out.rank != rank) {
      return absl::DataLossError(absl::StrCat("spill: ", path, " describes rank ", out.rank));
    }
    for (const json& f : j.at("files")) {
      CheckpointFile file = CheckpointFileFromDescription(f);
      // A rank's description names only that rank's own files.
      if ((file.group != "model" && file.group != "optimizer") ||
          file.name != FileName(file.group, rank)) {
        return absl::DataLossError(absl::StrCat("spill: ", path, " names file '", file.name,
                                                "' of group '", file.group, "', not ",
                                                FileName("model", rank), " or ",
                                                FileName("optimizer", rank)));
      }
      out.files.push_back(std::move(file));
      out.digests.push_back({f.at("bytes").get<int64_t>(), f.at("crc32").get<uint32_t>()});
    }
    out.moe_bias = j.at("moe_bias");
    if (!out.moe_bias.is_object()) {
      return absl::DataLossError(absl::StrCat("spill: ", path, ": moe_bias is not an object"));
    }
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("spill: ", path, ": ", e.what()));
  }
  return out;
}

absl::StatusOr<std::string> CommitSpilledStep(const std::string& root, const std::string& dir,
                                              CheckpointContent content,
                                              const std::vector<SpilledRank>& ranks,
                                              int64_t keep, const CommitGate& gate) {
  content.files.clear();
  std::vector<FileDigest> digests;
  json moe_bias = json::object();
  for (const SpilledRank& r : ranks) {
    for (size_t i = 0; i < r.files.size(); ++i) {
      content.files.push_back(r.files[i]);
      digests.push_back(r.digests[i]);
    }
    // Every replica of a layer's biases holds the same values.
    for (auto it = r.moe_bias.begin(); it != r.moe_bias.end(); ++it) {
      if (!moe_bias.contains(it.key())) moe_bias[it.key()] = it.value();
    }
  }
  if (!moe_bias.empty()) content.state["moe_bias"] = std::move(moe_bias);
  if (gate) {
    if (absl::Status answer = gate(content.step); !answer.ok()) {
      std::error_code ec;
      fs::remove_all(dir, ec);  // nothing of this step may land in the root
      return answer;
    }
  }
  return CommitCheckpointStep(root, dir, content, digests, keep);
}

}  // namespace loom::engine
