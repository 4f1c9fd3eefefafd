// Writing and committing one checkpoint step. The step becomes visible only
// through an atomic rename of a fully written and fsynced temporary directory,
// so a reader never sees a torn step; older steps beyond `keep` are removed
// only after the new one is committed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "nlohmann/json.hpp"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

// One safetensors file of the step. group ("model", "optimizer") lets export
// and loaders select tensors; tensor names are global and unique across files.
struct CheckpointFile {
  std::string name;
  std::string group;
  std::vector<TensorView> tensors;
};

struct CheckpointContent {
  int64_t step = 0;
  spec::ModelSpec model;
  std::vector<CheckpointFile> files;
  // Whatever the training loop needs to resume (data position, RNG, tokens).
  nlohmann::json state = nlohmann::json::object();
};

// Writes <root>/step_NNNNNNNN/ (replacing an existing step of that number),
// then deletes all but the newest `keep` committed steps (keep <= 0 keeps
// all) and stale temporary directories. Returns the committed directory.
absl::StatusOr<std::string> CommitCheckpoint(const std::string& root,
                                             const CheckpointContent& content, int64_t keep);

}  // namespace loom::engine
