// Resuming from checkpoints, with the fallback policy: the newest step
// directory is tried first; if it is refused (torn, corrupt, or for another
// model) the loader says why and tries the next older one, and so on. Only
// when every step is refused does loading fail, listing each refusal: a job
// must not silently restart from scratch over checkpoints it could not read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/checkpoint_reader.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

struct LoadedCheckpoint {
  int64_t step = 0;
  std::string dir;
  nlohmann::json state;
  // One line per newer step that was refused: "<dir>: <error>".
  std::vector<std::string> refused;
  // The data files of the loaded step this process read (and CRC-checked).
  std::vector<std::string> files_read;
};

// Which files of a step a load reads and CRC-checks before it copies.
enum class StepFiles {
  kAll,     // every file: the step loads only if it is intact as a whole
  kNeeded,  // only those holding shards that overlap the targets (a rank of
            // a sharded layout; see collective_restore.h for how the ranks
            // still agree on one step)
};

// Verifies step_dir completely (see CheckpointReader: every file's size and
// CRC-32) and checks that the model config and every tensor of `into` match;
// only then copies the tensors into `into`, so a refused checkpoint leaves
// `into` untouched.
absl::StatusOr<LoadedCheckpoint> LoadCheckpointStep(const std::string& step_dir,
                                                    const spec::ModelSpec& model,
                                                    const std::vector<TensorView>& into);

// The newest loadable step under root. NOT_FOUND when root holds no step
// directory at all (start from scratch); FAILED_PRECONDITION when there are
// steps but every one was refused.
absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& root,
                                                      const spec::ModelSpec& model,
                                                      const std::vector<TensorView>& into);

// The same for flat ranges of global tensors (a rank of a sharded layout
// loading its shard from a checkpoint of any layout).
absl::StatusOr<LoadedCheckpoint> LoadCheckpointStep(const std::string& step_dir,
                                                    const spec::ModelSpec& model,
                                                    const std::vector<FlatSlice>& into);
absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& root,
                                                      const spec::ModelSpec& model,
                                                      const std::vector<FlatSlice>& into);

// The same for rectangular slices of global tensors: what a rank of any
// layout (TP shards, ZeRO's ranges of them) loads from a step saved under
// any other.
absl::StatusOr<LoadedCheckpoint> LoadCheckpointStep(const std::string& step_dir,
                                                    const spec::ModelSpec& model,
                                                    const std::vector<CheckpointRect>& into);
absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& root,
                                                      const spec::ModelSpec& model,
                                                      const std::vector<CheckpointRect>& into);

// LoadCheckpointStep in two halves, for a caller that decides between them
// (the ranks agreeing on a step): Prepare opens the step, checks the model
// and the targets and reads and verifies the files (`files`), copying
// nothing; Copy then fills the targets from the files already read.
struct PreparedStep {
  std::string dir;
  CheckpointReader reader;
};
absl::StatusOr<PreparedStep> PrepareCheckpointStep(const std::string& step_dir,
                                                   const spec::ModelSpec& model,
                                                   const std::vector<CheckpointRect>& into,
                                                   StepFiles files);
absl::StatusOr<LoadedCheckpoint> CopyPreparedStep(const PreparedStep& step,
                                                  const std::vector<CheckpointRect>& into);

}  // namespace loom::engine
