// What the training loop reports after each optimizer step, and its two
// printed forms (one human line, one JSON object per line).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/engine/model/moe_summary.h"

namespace loom::engine {

// The in-memory snapshots of in-place recovery as of a step
// (docs/fault_tolerance.md): what the rank holds, and what taking and copying
// them cost.
struct SnapshotProgress {
  std::vector<int64_t> own_steps;   // complete snapshots of its own state, oldest first
  int ward_rank = -1;               // whose copies it holds; -1: none
  std::vector<int64_t> ward_steps;  // complete copies of the ward's snapshots, oldest first
  int64_t snapshot_bytes = 0;       // one snapshot of its own state
  double capture_seconds = 0;       // this step's capture into host memory (0: none due)
  double wait_seconds = 0;          // this step's wait for the previous copy to be acknowledged
  double copy_seconds = 0;          // the last completed copy to the buddy (in the background)
  int64_t copy_bytes = 0;           // its bytes
};

struct StepProgress {
  int64_t step = 0;  // optimizer steps completed, 1-based
  int64_t total_steps = 0;
  double loss = 0;  // mean training cross-entropy of this step's global batch (nats)
  double lr = 0;    // learning rate applied at this step
  double grad_norm = 0;  // global L2 norm of the DP-reduced gradient, before clipping
  int64_t tokens = 0;    // cumulative tokens trained, all DP ranks together
  double step_seconds = 0;  // forward/backward/reduce/update of this step, without evaluation
  double tokens_per_second = 0;  // this step's global tokens / step_seconds
  double flops_per_token = 0;    // model FLOPs per trained token: 6*N + 12*L*h*s
  std::optional<double> val_loss;  // on evaluation steps
  double eval_seconds = 0;
  int64_t peak_rss_bytes = 0;  // peak resident set of this process
  // Peak bytes the backend's device allocator held for tensors during this
  // step; 0 on host backends (their memory is the resident set).
  int64_t peak_device_bytes = 0;
  // [moe] The step's expert statistics, for a model with model.moe.
  std::optional<MoeSummary> moe;
  // With fault_tolerance.snapshot_interval > 0 in a coordinated run.
  std::optional<SnapshotProgress> snapshot;
  // Bad steps (docs/fault_tolerance.md): why this step was not applied
  // ("non-finite gradients (norm nan)", a rolled-back loss spike); empty:
  // applied. And how many steps of the run so far were not applied.
  std::string bad_step;
  int64_t skipped_steps = 0;
};

// "step 5/50 loss 4.1234 lr 3.00e-03 grad_norm 1.234 tokens 10240 step_s 0.123 tok/s 83252
//  rss 61.2MiB [snap 1.2MiB capture 0.001s copy 0.004s] [val_loss 3.9876]"
std::string FormatProgressLine(const StepProgress& p);
// {"step":5,"total_steps":50,"loss":...,"val_loss":... (eval steps only)}
std::string FormatProgressJson(const StepProgress& p);

}  // namespace loom::engine
