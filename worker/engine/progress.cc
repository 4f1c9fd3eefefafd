#include "worker/engine/progress.h"

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace loom::engine {

std::string FormatProgressLine(const StepProgress& p) {
  std::string line = absl::StrFormat(
      "step %d/%d loss %.4f lr %.2e grad_norm %.3f tokens %d step_s %.3f tok/s %.0f rss %.1fMiB",
      p.step, p.total_steps, p.loss, p.lr, p.grad_norm, p.tokens, p.step_seconds,
      p.tokens_per_second, static_cast<double>(p.peak_rss_bytes) / (1024.0 * 1024.0));
  if (p.peak_device_bytes > 0) {
    absl::StrAppendFormat(&line, " device %.1fMiB", static_cast<double>(p.peak_device_bytes) / (1024.0 * 1024.0));
  }
  if (p.moe) {
    absl::StrAppendFormat(&line, " moe_imbalance %.3f moe_aux %.4f", p.moe->imbalance,
                          p.moe->aux_loss);
    if (p.moe->dropped_fraction > 0) {
      absl::StrAppendFormat(&line, " moe_dropped %.4f", p.moe->dropped_fraction);
    }
  }
  if (p.snapshot && p.snapshot->snapshot_bytes > 0) {
    const SnapshotProgress& s = *p.snapshot;
    absl::StrAppendFormat(&line, " snap %.1fMiB",
                          static_cast<double>(s.snapshot_bytes) / (1024.0 * 1024.0));
    if (s.capture_seconds > 0) absl::StrAppendFormat(&line, " capture %.3fs", s.capture_seconds);
    if (s.wait_seconds >= 0.001) absl::StrAppendFormat(&line, " copy_wait %.3fs", s.wait_seconds);
    if (s.copy_bytes > 0) absl::StrAppendFormat(&line, " copy %.3fs", s.copy_seconds);
  }
  if (p.val_loss) absl::StrAppendFormat(&line, " val_loss %.4f", *p.val_loss);
  if (p.skipped_steps > 0) absl::StrAppendFormat(&line, " skipped %d", p.skipped_steps);
  if (!p.bad_step.empty()) absl::StrAppendFormat(&line, " BAD STEP: %s", p.bad_step);
  return line;
}

std::string FormatProgressJson(const StepProgress& p) {
  nlohmann::json j = {{"step", p.step},
                      {"total_steps", p.total_steps},
                      {"loss", p.loss},
                      {"lr", p.lr},
                      {"grad_norm", p.grad_norm},
                      {"tokens", p.tokens},
                      {"step_seconds", p.step_seconds},
                      {"tokens_per_second", p.tokens_per_second},
                      {"flops_per_token", p.flops_per_token},
                      {"peak_rss_bytes", p.peak_rss_bytes},
                      {"peak_device_bytes", p.peak_device_bytes}};
  if (p.moe) {
    j["moe"] = {{"tokens_per_expert", p.moe->tokens_per_expert},
                {"tokens_min", p.moe->tokens_min},
                {"tokens_max", p.moe->tokens_max},
                {"imbalance", p.moe->imbalance},
                {"dropped_fraction", p.moe->dropped_fraction},
                {"aux_loss", p.moe->aux_loss}};
  }
  if (p.snapshot) {
    const SnapshotProgress& s = *p.snapshot;
    j["snapshot"] = {{"own_steps", s.own_steps},          {"ward_rank", s.ward_rank},
                     {"ward_steps", s.ward_steps},        {"snapshot_bytes", s.snapshot_bytes},
                     {"capture_seconds", s.capture_seconds}, {"wait_seconds", s.wait_seconds},
                     {"copy_seconds", s.copy_seconds},    {"copy_bytes", s.copy_bytes}};
  }
  if (p.skipped_steps > 0) j["skipped_steps"] = p.skipped_steps;
  if (!p.bad_step.empty()) j["bad_step"] = p.bad_step;
  if (p.val_loss) {
    j["val_loss"] = *p.val_loss;
    j["eval_seconds"] = p.eval_seconds;
  }
  return j.dump();
}

}  // namespace loom::engine
