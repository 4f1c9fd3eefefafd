// What the training loop reports after each optimizer step, and its two
// printed forms (one human line, one JSON object per line).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "worker/engine/model/moe_summary.h"

namespace loom::engine {

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
};

// "step 5/50 loss 4.1234 lr 3.00e-03 grad_norm 1.234 tokens 10240 step_s 0.123 tok/s 83252 rss 61.2MiB [val_loss 3.9876]"
std::string FormatProgressLine(const StepProgress& p);
// {"step":5,"total_steps":50,"loss":...,"val_loss":... (eval steps only)}
std::string FormatProgressJson(const StepProgress& p);

}  // namespace loom::engine
