// The standalone trainer: one rank, no coordinator. Reads a job spec, resolves
// its relative paths, trains to train.steps with the checkpoint policy
// (resume from the newest loadable checkpoint, save every checkpoint.interval
// steps and at the end) and prints one progress line per step. The backend
// follows resources.device and train.precision (worker/engine/ops_selection.h).
#pragma once

#include <iosfwd>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"

namespace loom::trainer {

enum class ProgressFormat { kText, kJsonLines };

struct StandaloneOptions {
  std::string spec_path;
  std::string work_dir;  // empty: the spec file's directory
  ProgressFormat format = ProgressFormat::kText;
  // Exit after this step as if preempted (tests, drills); 0: run to the end.
  int64_t stop_after_step = 0;
  std::ostream* progress = nullptr;  // nullptr: stdout
  std::ostream* events = nullptr;    // nullptr: stderr
};

// Relative data.train_path / data.val_path resolve against the spec file's
// directory (the data travels with the spec); a relative checkpoint.dir
// resolves against work_dir when given (run state lives with the run), else
// against the spec file's directory.
spec::JobSpec ResolveSpecPaths(spec::JobSpec spec, const std::string& spec_path,
                               const std::string& work_dir);

absl::Status RunStandalone(const StandaloneOptions& options);
absl::Status RunStandalone(const std::string& spec_path, const std::string& work_dir);

// The process exit code for a run's result: 0, kExitJobBroken for a job that
// cannot run as written (spec, data, checkpoint), kExitCollectiveTimeout for
// a collective that timed out, kExitCrash otherwise.
int ExitCodeFor(const absl::Status& status);

}  // namespace loom::trainer
