#include "worker/engine/checkpoint/distributed_save.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/durable_file.h"
#include "worker/engine/parallel/host_floats.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kMaxFiles = 2;  // model and optimizer
// Per rank: [wrote ok (1) / failed (0), file count, kMaxFiles digests].
constexpr int kSlotInts = 2 + kMaxFiles * kDigestInts;
// The commit's outcome as the first rank broadcasts it.
constexpr int32_t kFailed = 0, kCommitted = 1, kSkipped = 2, kFenced = 3;

int MeshRank(const std::vector<comm::Communicator*>& mesh) {
  int rank = 0, stride = 1;
  for (comm::Communicator* g : mesh) {
    if (g == nullptr) continue;
    rank += g->rank() * stride;
    stride *= g->size();
  }
  return rank;
}

int MeshSize(const std::vector<comm::Communicator*>& mesh) {
  int size = 1;
  for (comm::Communicator* g : mesh) size *= g != nullptr ? g->size() : 1;
  return size;
}

// The first rank's values everywhere: along each group from its rank 0, so
// after the last group every rank holds the first rank's.
absl::Status BroadcastFromFirst(kernels::Ops& ops, const std::vector<comm::Communicator*>& mesh,
                                int32_t* values, int64_t n) {
  for (comm::Communicator* g : mesh) {
    if (absl::Status s = BroadcastHostInts(ops, g, values, n, 0); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Every rank's n values on every rank, in MeshRank order.
absl::Status AllGatherMesh(kernels::Ops& ops, const std::vector<comm::Communicator*>& mesh,
                           const std::vector<int32_t>& mine, std::vector<int32_t>* all) {
  *all = mine;
  for (comm::Communicator* g : mesh) {
    if (g == nullptr) continue;
    std::vector<int32_t> gathered(all->size() * static_cast<size_t>(g->size()));
    if (absl::Status s = AllGatherHostInts(ops, g, all->data(), static_cast<int64_t>(all->size()),
                                           gathered.data());
        !s.ok()) {
      return s;
    }
    *all = std::move(gathered);
  }
  return absl::OkStatus();
}

std::string PiecesFileName(int rank) { return absl::StrFormat("pieces-r%05d.json", rank); }

json Describe(const std::vector<CheckpointFile>& files) {
  json out = json::array();
  for (const CheckpointFile& f : files) out.push_back(DescribeCheckpointFile(f));
  return out;
}

// A rank's description as files for the index (no data). Written moments ago
// by a rank of this job; still read defensively.
absl::StatusOr<std::vector<CheckpointFile>> ReadDescription(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileBytes(path);
  if (!text.ok()) return text.status();
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path, " is not a JSON array"));
  }
  std::vector<CheckpointFile> files;
  try {
    for (const json& f : j) files.push_back(CheckpointFileFromDescription(f));
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path, ": ", e.what()));
  }
  return files;
}

}  // namespace

absl::StatusOr<std::string> SaveDistributedStep(kernels::Ops& ops,
                                                const std::vector<comm::Communicator*>& mesh,
                                                const std::string& root,
                                                const CheckpointContent& content, int64_t keep,
                                                const CommitGate& gate) {
  const int rank = MeshRank(mesh), ranks = MeshSize(mesh);
  const bool first = rank == 0;

  // 1. The first rank opens the temporary directory; everyone learns its tag.
  absl::StatusOr<std::string> begun = std::string();
  int32_t header[2] = {0, 0};  // started, pid
  if (first) {
    begun = BeginCheckpointStep(root, content.step, ::getpid());
    header[0] = begun.ok() ? 1 : 0;
    header[1] = static_cast<int32_t>(::getpid());
  }
  if (absl::Status s = BroadcastFromFirst(ops, mesh, header, 2); !s.ok()) return s;
  if (header[0] != 1) {
    if (first) return begun.status();
    return absl::InternalError(absl::StrCat("the first rank could not start the checkpoint of step ",
                                            content.step, " under ", root));
  }
  const std::string tmp = CheckpointTempDir(root, content.step, static_cast<int64_t>(header[1]));

  // 2. This rank's files and their description.
  std::vector<CheckpointFile> mine;
  for (const CheckpointFile& f : content.files) {
    if (f.tensors.empty()) continue;
    CheckpointFile named = f;
    named.name = absl::StrFormat("%s-r%05d.safetensors", f.group, rank);
    mine.push_back(std::move(named));
  }
  std::vector<int32_t> slot(kSlotInts, 0);
  absl::Status write_status;
  if (mine.size() > kMaxFiles) {
    write_status = absl::InternalError(absl::StrCat("checkpoint: rank ", rank, " has ",
                                                    mine.size(), " files, at most ", kMaxFiles));
  }
  for (size_t i = 0; write_status.ok() && i < mine.size(); ++i) {
    absl::StatusOr<FileDigest> d = WriteCheckpointFile(tmp, mine[i]);
    if (!d.ok()) {
      write_status = d.status();
      break;
    }
    EncodeFileDigest(*d, &slot[2 + i * kDigestInts]);
  }
  if (write_status.ok() && !mine.empty()) {
    absl::StatusOr<FileDigest> d = WriteFileDurably(
        (fs::path(tmp) / PiecesFileName(rank)).string(), Describe(mine).dump());
    if (!d.ok()) write_status = d.status();
  }
  slot[0] = write_status.ok() ? 1 : 0;
  slot[1] = static_cast<int32_t>(mine.size());
  std::vector<int32_t> slots;
  if (absl::Status s = AllGatherMesh(ops, mesh, slot, &slots); !s.ok()) return s;

  // 3. The first rank commits when every rank wrote what it said it would.
  absl::StatusOr<std::string> committed = std::string();
  int32_t ok = kFailed;
  absl::Status gate_answer;
  if (first) {
    CheckpointContent all = content;
    all.files.clear();
    std::vector<FileDigest> digests;
    std::vector<std::string> failed;
    for (int r = 0; r < ranks && committed.ok(); ++r) {
      const int32_t* s = &slots[static_cast<size_t>(r) * kSlotInts];
      if (s[0] != 1) {
        failed.push_back(absl::StrCat("rank ", r));
        continue;
      }
      if (s[1] == 0) continue;
      const std::string pieces = (fs::path(tmp) / PiecesFileName(r)).string();
      absl::StatusOr<std::vector<CheckpointFile>> files = ReadDescription(pieces);
      if (!files.ok()) {
        committed = files.status();
        break;
      }
      if (static_cast<int32_t>(files->size()) != s[1]) {
        committed = absl::DataLossError(absl::StrCat("checkpoint: ", pieces, " describes ",
                                                     files->size(), " files, rank ", r,
                                                     " wrote ", s[1]));
        break;
      }
      for (size_t i = 0; i < files->size(); ++i) {
        digests.push_back(DecodeFileDigest(&s[2 + i * kDigestInts]));
        all.files.push_back(std::move((*files)[i]));
      }
      std::error_code ec;
      fs::remove(pieces, ec);  // index.json replaces it
    }
    if (committed.ok() && !failed.empty()) {
      committed = absl::InternalError(absl::StrCat(
          "checkpoint of step ", content.step, ": not every rank wrote its shards (",
          absl::StrJoin(failed, ", "), ")",
          write_status.ok() ? "" : ": " + write_status.ToString()));
    } else if (committed.ok() && gate) {
      gate_answer = gate(content.step);
    }
    if (!gate_answer.ok()) {
      // Skipped or fenced: nothing of this step may land in the root.
      std::error_code ec;
      fs::remove_all(tmp, ec);
      const bool skip = absl::IsUnavailable(gate_answer) || absl::IsDeadlineExceeded(gate_answer);
      ok = skip ? kSkipped : kFenced;
    } else if (committed.ok()) {
      committed = CommitCheckpointStep(root, tmp, all, digests, keep);
      ok = committed.ok() ? kCommitted : kFailed;
    }
  }
  if (absl::Status s = BroadcastFromFirst(ops, mesh, &ok, 1); !s.ok()) return s;
  if (ok == kSkipped) return std::string();
  if (ok == kFenced) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint of step ", content.step, " abandoned: the commit gate refused it (this attempt "
        "is superseded)", first ? absl::StrCat(": ", gate_answer.message()) : ""));
  }
  if (first) return committed;
  if (!write_status.ok()) return write_status;
  if (ok != kCommitted) {
    return absl::InternalError(absl::StrCat("the first rank failed to commit the checkpoint of step ",
                                            content.step, " under ", root));
  }
  return std::string();
}

}  // namespace loom::engine
