#include "worker/engine/checkpoint/checkpoint_loader.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/checkpoint/checkpoint_format.h"
#include "worker/engine/checkpoint/checkpoint_reader.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace loom::engine {
namespace {

std::vector<FlatSlice> WholeTensors(const std::vector<TensorView>& into) {
  std::vector<FlatSlice> out;
  out.reserve(into.size());
  for (const TensorView& t : into) out.push_back({t.name, t.shape, 0, t.numel(), t.data});
  return out;
}

const std::vector<int64_t>& GlobalShapeOf(const FlatSlice& t) { return t.shape; }
const std::vector<int64_t>& GlobalShapeOf(const CheckpointRect& t) { return t.global_shape; }

// Opens the step, checks the model and every target's name and global shape,
// and reads and verifies the files (`files`) before anything is copied, so a
// refused step leaves the targets untouched.
template <typename Target>
absl::StatusOr<PreparedStep> Prepare(const std::string& step_dir, const spec::ModelSpec& model,
                                     const std::vector<Target>& into, StepFiles files) {
  absl::StatusOr<CheckpointReader> reader =
      CheckpointReader::Open(step_dir, CheckpointReadMode::kOnDemand);
  if (!reader.ok()) return reader.status();
  if (absl::Status s = CheckSameModelShape(model, reader->model(),
                                           absl::StrCat(step_dir, "/", kCheckpointMetadataFile));
      !s.ok()) {
    return s;
  }
  for (const Target& t : into) {
    const CheckpointTensorInfo* info = reader->Find(t.name);
    if (info == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", step_dir, ": model mismatch: tensor ", t.name, " is not in index.json"));
    }
    if (info->shape != GlobalShapeOf(t)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", step_dir, "/", info->file, ": model mismatch: tensor ", t.name,
          " has shape ", ShapeString(info->shape), " but the model has ",
          ShapeString(GlobalShapeOf(t))));
    }
  }
  // The targets' files first (kept for the copy), then, for kAll, the rest
  // (verified and dropped).
  for (const Target& t : into) {
    if (absl::Status s = reader->Fetch(t); !s.ok()) return s;
  }
  if (files == StepFiles::kAll) {
    if (absl::Status s = reader->VerifyAllFiles(); !s.ok()) return s;
  }
  return PreparedStep{step_dir, *std::move(reader)};
}

template <typename Target>
absl::StatusOr<LoadedCheckpoint> Copy(const PreparedStep& step, const std::vector<Target>& into) {
  for (const Target& t : into) {
    if (absl::Status s = step.reader.CopyTo(t); !s.ok()) return s;
  }
  LoadedCheckpoint out;
  out.step = step.reader.step();
  out.dir = step.dir;
  out.state = step.reader.state();
  out.files_read = step.reader.files_read();
  return out;
}

template <typename Target>
absl::StatusOr<LoadedCheckpoint> LoadStep(const std::string& step_dir, const spec::ModelSpec& model,
                                          const std::vector<Target>& into) {
  absl::StatusOr<PreparedStep> step = Prepare(step_dir, model, into, StepFiles::kAll);
  if (!step.ok()) return step.status();
  return Copy(*step, into);
}

template <typename Target>
absl::StatusOr<LoadedCheckpoint> LoadNewest(const std::string& root, const spec::ModelSpec& model,
                                            const std::vector<Target>& into) {
  const auto steps = ListStepDirs(root);
  if (steps.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint under ", root));
  }
  std::vector<std::string> refused;
  for (const auto& [step, dir] : steps) {
    absl::StatusOr<LoadedCheckpoint> loaded = LoadStep(dir, model, into);
    if (loaded.ok()) {
      loaded->refused = std::move(refused);
      return loaded;
    }
    refused.push_back(absl::StrCat(dir, ": ", loaded.status().message()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "every checkpoint under ", root, " was refused: ", absl::StrJoin(refused, "; "),
      " (remove or repair them, or point checkpoint.dir elsewhere to start fresh)"));
}

}  // namespace

absl::StatusOr<PreparedStep> PrepareCheckpointStep(const std::string& step_dir,
                                                   const spec::ModelSpec& model,
                                                   const std::vector<CheckpointRect>& into,
                                                   StepFiles files) {
  return Prepare(step_dir, model, into, files);
}

absl::StatusOr<LoadedCheckpoint> CopyPreparedStep(const PreparedStep& step,
                                                  const std::vector<CheckpointRect>& into) {
  return Copy(step, into);
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointStep(const std::string& step_dir,
                                                    const spec::ModelSpec& model,
                                                    const std::vector<FlatSlice>& into) {
  return LoadStep(step_dir, model, into);
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointStep(const std::string& step_dir,
                                                    const spec::ModelSpec& model,
                                                    const std::vector<CheckpointRect>& into) {
  return LoadStep(step_dir, model, into);
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointStep(const std::string& step_dir,
                                                    const spec::ModelSpec& model,
                                                    const std::vector<TensorView>& into) {
  return LoadCheckpointStep(step_dir, model, WholeTensors(into));
}

absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& root,
                                                      const spec::ModelSpec& model,
                                                      const std::vector<FlatSlice>& into) {
  return LoadNewest(root, model, into);
}

absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& root,
                                                      const spec::ModelSpec& model,
                                                      const std::vector<CheckpointRect>& into) {
  return LoadNewest(root, model, into);
}

absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& root,
                                                      const spec::ModelSpec& model,
                                                      const std::vector<TensorView>& into) {
  return LoadNewestCheckpoint(root, model, WholeTensors(into));
}

}  // namespace loom::engine
