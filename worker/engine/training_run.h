// Running a training loop to the end with the checkpoint policy: resume from
// the newest loadable checkpoint, save every checkpoint.interval steps and at
// the last step, and (coordinated) take the in-memory snapshots. Bad steps
// (bad_steps.h): a loss spike rolls back to the snapshot before it and skips
// its batch (with `snapshots`), and too many bad steps in a row end the run
// with FAILED_PRECONDITION naming them. Used by the standalone runner and the
// coordinated trainer.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "worker/engine/progress.h"
#include "worker/engine/snapshot_keeper.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {

struct RunOptions {
  std::string checkpoint_root;  // empty: no resume, no checkpoints
  bool resume = true;
  // Read only: when checkpoint_root holds no checkpoint yet, resume from the
  // newest one here (checkpoint.resume_from: another job of the same owner).
  std::string resume_from;
  // Stop after this step as a preempted rank would (0: run to train.steps).
  // Checkpoints due by then are written; nothing else is.
  int64_t stop_after_step = 0;
  // A graceful stop (preemption, a drain, SIGUSR1): asked after every step,
  // the job votes (TrainingLoop::AnyRank) and, when any rank was asked, every
  // rank saves a checkpoint of that step and the run ends: on_stopped is
  // told the step and why, and RunTraining returns OK. Null: no vote (a
  // standalone run).
  std::function<std::optional<std::string>()> stop_requested;
  std::function<void(int64_t step, const std::string& why)> on_stopped;
  // Called after every step; an error stops the run and is returned.
  std::function<absl::Status(const StepProgress&)> on_step;
  // Human-readable events: resumed, refused checkpoints, checkpoints saved.
  std::function<void(const std::string&)> on_event;
  // Called once before the first step, when loading the checkpoint is over
  // (or there was none), with the step the run resumes after (0: the start).
  std::function<void(int64_t)> on_resumed;
  // In-place recovery: takes the snapshots due after each step (before
  // on_step, which then sees them in StepProgress::snapshot) and, once the
  // run is done, waits for the copies in flight. Null: none.
  SnapshotKeeper* snapshots = nullptr;
};

absl::Status RunTraining(TrainingLoop& loop, const RunOptions& options);

}  // namespace loom::engine
