#include "worker/engine/training_run.h"

#include "absl/strings/str_cat.h"
#include "worker/engine/bad_steps.h"

namespace loom::engine {

absl::Status RunTraining(TrainingLoop& loop, const RunOptions& options) {
  auto event = [&options](const std::string& message) {
    if (options.on_event) options.on_event(message);
  };
  const std::string& root = options.checkpoint_root;
  if (!root.empty() && options.resume) {
    absl::StatusOr<LoadedCheckpoint> loaded = loop.RestoreNewest(root);
    if (absl::IsNotFound(loaded.status()) && !options.resume_from.empty()) {
      event(absl::StrCat("no checkpoint under ", root, "; looking in ", options.resume_from,
                         " (checkpoint.resume_from)"));
      loaded = loop.RestoreNewest(options.resume_from);
    }
    if (loaded.ok()) {
      for (const std::string& why : loaded->refused) {
        event(absl::StrCat("checkpoint refused, falling back to an older step: ", why));
      }
      event(absl::StrCat("resumed from ", loaded->dir, " at step ", loaded->step));
    } else if (absl::IsNotFound(loaded.status())) {
      event(absl::StrCat("no checkpoint under ", root, "; starting at step 0"));
    } else {
      return loaded.status();
    }
  }
  if (options.on_resumed) options.on_resumed(loop.step());
  const int64_t interval = loop.spec().checkpoint.interval;
  int64_t saved_step = loop.step();
  BadStepPolicy bad_steps(loop.spec().fault_tolerance);
  while (!loop.done()) {
    absl::StatusOr<StepProgress> p = loop.TrainStep();
    if (!p.ok()) return p.status();
    if (p->bad_step.empty()) {
      const std::string spike = bad_steps.SpikeReason(p->step, p->loss);
      if (!spike.empty() && options.snapshots != nullptr) {
        // Back to the snapshot before it (every rank decides alike: the loss
        // is the job's); the loop replays any steps after that snapshot and
        // then passes over this batch (TrainingLoop::SkipBatch).
        absl::StatusOr<int64_t> back = options.snapshots->RollBackBefore(loop, p->step);
        if (back.ok()) {
          const std::string why =
              absl::StrCat(spike, "; rolled back to step ", *back, " and its batch skipped");
          event(absl::StrCat("step ", p->step, ": ", why));
          loop.SkipBatch(p->step, why, p->loss);
          continue;
        }
        if (!absl::IsNotFound(back.status())) return back.status();
        event(absl::StrCat("step ", p->step, ": ", spike, ", applied: ", back.status().message()));
      }
    }
    if (absl::Status s = bad_steps.Settle(p->step, p->bad_step, p->loss); !s.ok()) return s;
    if (options.snapshots != nullptr) {
      if (absl::Status s = options.snapshots->AfterStep(loop, &*p); !s.ok()) return s;
    }
    if (options.on_step) {
      if (absl::Status s = options.on_step(*p); !s.ok()) return s;
    }
    const bool due = (interval > 0 && p->step % interval == 0) || loop.done();
    if (!root.empty() && due && saved_step != p->step) {
      absl::StatusOr<std::string> dir = loop.SaveCheckpoint(root);
      if (!dir.ok()) return dir.status();
      saved_step = p->step;
      if (!dir->empty()) event(absl::StrCat("checkpoint saved: ", *dir));
    }
    if (options.stop_requested && !loop.done()) {
      const std::optional<std::string> mine = options.stop_requested();
      absl::StatusOr<bool> stop = loop.AnyRank(mine.has_value());
      if (!stop.ok()) return stop.status();
      if (*stop) {
        // Every rank saves this step (a rank not asked itself learns only
        // that another was), so the job resumes from exactly here.
        const std::string why = mine.value_or("another rank of the job was asked to stop");
        if (root.empty()) {
          event(absl::StrCat("stopping after step ", p->step, " (", why,
                             "): no checkpoint.dir, so nothing is saved"));
        } else if (saved_step != p->step) {
          absl::StatusOr<std::string> dir = loop.SaveCheckpoint(root);
          if (!dir.ok()) return dir.status();
          saved_step = p->step;
          if (!dir->empty()) event(absl::StrCat("checkpoint saved: ", *dir));
        }
        if (options.snapshots != nullptr) options.snapshots->WaitForCopies();
        if (options.on_stopped) options.on_stopped(p->step, why);
        return absl::OkStatus();
      }
    }
    if (options.stop_after_step > 0 && p->step >= options.stop_after_step) {
      event(absl::StrCat("stopping after step ", p->step, " as asked"));
      break;
    }
  }
  if (options.snapshots != nullptr) options.snapshots->WaitForCopies();
  return absl::OkStatus();
}

}  // namespace loom::engine
