// A whole checkpoint step written and committed by one writer in one call:
// how the tests make checkpoints to read, load, fuzz and export. The engine
// itself always saves through SaveDistributedStep (worker/engine/checkpoint/
// distributed_save.h), which uses the same three calls across its ranks.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"

namespace loom::engine::testing {

// Writes <root>/step_NNNNNNNN/ (replacing an existing step of that number),
// then deletes all but the newest `keep` committed steps (keep <= 0 keeps
// all) and stale temporary directories. Returns the committed directory.
inline absl::StatusOr<std::string> CommitCheckpoint(const std::string& root,
                                                    const CheckpointContent& content,
                                                    int64_t keep) {
  absl::StatusOr<std::string> tmp = BeginCheckpointStep(root, content.step, ::getpid());
  if (!tmp.ok()) return tmp.status();
  std::vector<FileDigest> digests;
  std::set<std::string> seen;
  for (const CheckpointFile& f : content.files) {
    if (!seen.insert(f.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: file ", f.name, " given twice"));
    }
    absl::StatusOr<FileDigest> d = WriteCheckpointFile(*tmp, f);
    if (!d.ok()) return d.status();
    digests.push_back(*d);
  }
  return CommitCheckpointStep(root, *tmp, content, digests, keep);
}

}  // namespace loom::engine::testing
