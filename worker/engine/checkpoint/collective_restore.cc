#include "worker/engine/checkpoint/collective_restore.h"

#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/checkpoint/checkpoint_format.h"
#include "worker/engine/parallel/host_floats.h"

namespace loom::engine {
namespace {

bool IsFirstRank(const std::vector<comm::Communicator*>& mesh) {
  for (comm::Communicator* g : mesh) {
    if (g != nullptr && g->rank() != 0) return false;
  }
  return true;
}

// The first rank's step everywhere (as two int32 halves: steps are int64).
absl::Status BroadcastStep(kernels::Ops& ops, const std::vector<comm::Communicator*>& mesh,
                           int64_t* step) {
  int32_t v[2] = {static_cast<int32_t>(*step >> 32), static_cast<int32_t>(*step & 0xffffffff)};
  for (comm::Communicator* g : mesh) {
    if (absl::Status s = BroadcastHostInts(ops, g, v, 2, 0); !s.ok()) return s;
  }
  *step = (static_cast<int64_t>(v[0]) << 32) | static_cast<int64_t>(static_cast<uint32_t>(v[1]));
  return absl::OkStatus();
}

// How many ranks of the mesh failed: the sum along each group in turn is the
// sum over the mesh. A control value, so it travels as integers (an
// all-gather copies bytes; a float all-reduce would add them).
absl::StatusOr<int64_t> CountFailures(kernels::Ops& ops,
                                      const std::vector<comm::Communicator*>& mesh, bool failed) {
  int32_t count = failed ? 1 : 0;
  for (comm::Communicator* g : mesh) {
    if (g == nullptr) continue;
    std::vector<int32_t> all(static_cast<size_t>(g->size()));
    if (absl::Status s = AllGatherHostInts(ops, g, &count, 1, all.data()); !s.ok()) return s;
    count = 0;
    for (int32_t c : all) count += c;
  }
  return count;
}

}  // namespace

absl::StatusOr<LoadedCheckpoint> RestoreNewestOnMesh(kernels::Ops& ops,
                                                     const std::vector<comm::Communicator*>& mesh,
                                                     const std::string& root,
                                                     const spec::ModelSpec& model,
                                                     const std::vector<CheckpointRect>& into) {
  const bool first = IsFirstRank(mesh);
  std::vector<std::pair<int64_t, std::string>> steps;
  if (first) steps = ListStepDirs(root);
  std::vector<std::string> refused;
  for (size_t round = 0;; ++round) {
    int64_t step = round < steps.size() ? steps[round].first : -1;
    if (absl::Status s = BroadcastStep(ops, mesh, &step); !s.ok()) return s;
    if (step < 0) break;
    const std::string dir = (std::filesystem::path(root) / StepDirName(step)).string();
    absl::StatusOr<PreparedStep> prepared =
        PrepareCheckpointStep(dir, model, into, StepFiles::kNeeded);
    absl::StatusOr<int64_t> failures = CountFailures(ops, mesh, !prepared.ok());
    if (!failures.ok()) return failures.status();
    if (*failures == 0) {
      absl::StatusOr<LoadedCheckpoint> loaded = CopyPreparedStep(*prepared, into);
      if (loaded.ok()) loaded->refused = std::move(refused);
      return loaded;
    }
    refused.push_back(prepared.ok()
                          ? absl::StrCat(dir, ": refused by ", *failures,
                                         " other rank(s) that could not read their files")
                          : absl::StrCat(dir, ": ", prepared.status().message()));
  }
  if (refused.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint under ", root));
  return absl::FailedPreconditionError(absl::StrCat(
      "every checkpoint under ", root, " was refused: ", absl::StrJoin(refused, "; "),
      " (remove or repair them, or point checkpoint.dir elsewhere to start fresh)"));
}

}  // namespace loom::engine
