#include "worker/trainer/standalone.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "common/spec/job_spec_rules.h"
#include "common/spec/job_spec_yaml.h"
#include "worker/engine/ops_selection.h"
#include "worker/engine/training_loop.h"
#include "worker/engine/training_run.h"
#include "worker/trainer/stopped_status.h"

namespace loom::trainer {
namespace {

namespace fs = std::filesystem;

std::string ResolveAgainst(const std::string& path, const fs::path& base) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return (base / path).lexically_normal().string();
}

}  // namespace

spec::JobSpec ResolveSpecPaths(spec::JobSpec spec, const std::string& spec_path,
                               const std::string& work_dir) {
  fs::path spec_dir = fs::path(spec_path).parent_path();
  if (spec_dir.empty()) spec_dir = ".";
  spec.data.train_path = ResolveAgainst(spec.data.train_path, spec_dir);
  spec.data.val_path = ResolveAgainst(spec.data.val_path, spec_dir);
  spec.checkpoint.dir =
      ResolveAgainst(spec.checkpoint.dir, work_dir.empty() ? spec_dir : fs::path(work_dir));
  return spec;
}

absl::Status RunStandalone(const StandaloneOptions& options) {
  std::ostream& progress = options.progress != nullptr ? *options.progress : std::cout;
  std::ostream& events = options.events != nullptr ? *options.events : std::cerr;
  absl::StatusOr<spec::JobSpec> parsed = spec::LoadJobSpecFile(options.spec_path);
  if (!parsed.ok()) return parsed.status();
  if (absl::Status s = spec::ValidateJobSpec(*parsed); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("job spec ", options.spec_path, ": ", s.message()));
  }
  const spec::JobSpec job = ResolveSpecPaths(*parsed, options.spec_path, options.work_dir);

  const int64_t dp = job.parallelism.dp.value_or(1);
  const int64_t tp = job.parallelism.tp.value_or(1);
  const int64_t pp = job.parallelism.pp.value_or(1);
  if (dp * tp * pp > 1 || job.resources.world_size() > 1) {
    events << "loom-trainer: standalone mode trains on one rank; the spec's parallel layout is "
              "ignored (the global batch, and so the result, is the same)\n";
  }
  // One rank: the backend the spec asks for (resources.device=gpu: CUDA
  // device 0, which the agent or the user selects with CUDA_VISIBLE_DEVICES).
  absl::StatusOr<std::shared_ptr<kernels::Ops>> ops = engine::MakeOpsForJob(job, 0);
  if (!ops.ok()) return ops.status();
  events << "loom-trainer: training on the " << (*ops)->name() << " backend\n";
  absl::StatusOr<std::unique_ptr<engine::TrainingLoop>> loop = engine::TrainingLoop::Create(
      job, /*dp_rank=*/0, /*dp_size=*/1, nullptr, nullptr, nullptr, *std::move(ops));
  if (!loop.ok()) return loop.status();

  engine::RunOptions run;
  run.checkpoint_root = job.checkpoint.dir;
  run.stop_after_step = options.stop_after_step;
  run.on_event = [&events](const std::string& message) {
    events << "loom-trainer: " << message << "\n" << std::flush;
  };
  run.on_step = [&progress, &options](const engine::StepProgress& p) {
    progress << (options.format == ProgressFormat::kJsonLines ? engine::FormatProgressJson(p)
                                                              : engine::FormatProgressLine(p))
             << "\n" << std::flush;
    return absl::OkStatus();
  };
  // A loss spike rolls back to a snapshot (fault_tolerance.loss_spike_factor):
  // one rank alone keeps them without a buddy.
  std::unique_ptr<engine::SnapshotKeeper> snapshots;
  if (job.fault_tolerance.loss_spike_factor > 0) {
    engine::SnapshotKeeperOptions keep;
    keep.interval = job.fault_tolerance.snapshot_interval;
    keep.rank = 0;
    snapshots = std::make_unique<engine::SnapshotKeeper>(keep);
    run.snapshots = snapshots.get();
  }
  return engine::RunTraining(**loop, run);
}

absl::Status RunStandalone(const std::string& spec_path, const std::string& work_dir) {
  StandaloneOptions options;
  options.spec_path = spec_path;
  options.work_dir = work_dir;
  return RunStandalone(options);
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  if (IsStopped(status)) return kExitStopped;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kFailedPrecondition:
      return kExitJobBroken;
    case absl::StatusCode::kDeadlineExceeded:
      // A collective timed out: a peer is gone or stuck.
      return kExitCollectiveTimeout;
    case absl::StatusCode::kPermissionDenied:
      // A superseded attempt: its commit gate or its token was refused.
      return kExitFenced;
    default:
      return kExitCrash;
  }
}

}  // namespace loom::trainer
