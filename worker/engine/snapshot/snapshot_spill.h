// In-memory snapshots written as a checkpoint step (docs/fault_tolerance.md,
// "Shrink"). An in-place recovery that finds no room for the failed ranks
// leaves the survivors holding every rank's state of one step: their own
// snapshots, and the copies the failed ranks' buddies hold. Written as a
// checkpoint step, it is what the job restarts from, re-planned onto fewer
// devices: the checkpoint loader reads any layout's step. The attempt's
// groups are gone (it aborted), so this needs no collective: each survivor
// writes the files of the ranks it holds into the step's spill directory,
// with a description of them, and the committing survivor commits the step
// once every rank of the layout is described, as SaveDistributedStep would
// (the same index, the same commit record, the same commit gate).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/checkpoint/distributed_save.h"
#include "worker/engine/snapshot/snapshot.h"

namespace loom::engine {

// The spill directory of `step` written by the survivors of `attempt`: every
// writer derives it; the next commit's pruning removes one left behind.
std::string SpillDir(const std::string& root, int64_t step, int attempt);

// The newest committed step under root (-1: none). A spill of a step no newer
// has nothing to add.
int64_t NewestCommittedStep(const std::string& root);

// What the committer needs of one rank's state, kept in the spill directory
// beside its files: their descriptions and digests and the rank's MoE
// selection biases (checkpoint state, not tensors).
struct SpilledRank {
  int rank = -1;
  std::vector<CheckpointFile> files;  // descriptions: no data
  std::vector<FileDigest> digests;    // one per file
  nlohmann::json moe_bias = nlohmann::json::object();
};

// Writes the pieces `snapshot` marks as written (a whole snapshot: a copy's
// borrowed pieces filled) as its owner rank's files in `dir`, then their
// description (durably: it is the rank's "done"). Returns the description
// file's digest, which tells the committer it read the whole of it.
absl::StatusOr<FileDigest> WriteSpilledRank(const std::string& dir, const Snapshot& snapshot);

// Reads rank `rank`'s description back; DATA_LOSS when it is not the file
// whose digest the writer gave, or is malformed.
absl::StatusOr<SpilledRank> ReadSpilledRank(const std::string& dir, int rank,
                                            const FileDigest& expected);

// Commits the step from every rank's description. `content` gives the step,
// the model and the state; the files and the MoE biases are added here. The
// gate is asked first, as SaveDistributedStep asks it: an answer other than
// OK removes the spill directory and is returned (nothing landed). Returns
// the committed step directory.
absl::StatusOr<std::string> CommitSpilledStep(const std::string& root, const std::string& dir,
                                              CheckpointContent content,
                                              const std::vector<SpilledRank>& ranks,
                                              int64_t keep, const CommitGate& gate);

// A digest as the short text a writer hands the committer ("<bytes>:<crc32>").
std::string FormatDigest(const FileDigest& digest);
absl::StatusOr<FileDigest> ParseDigest(const std::string& text);

}  // namespace loom::engine
