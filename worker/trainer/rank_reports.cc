#include "worker/trainer/rank_reports.h"

#include <algorithm>

namespace loom::trainer {

void SetTiming(const comm::StepCollectives& c, loom::v1::StepTiming* out) {
  out->Clear();
  // A stall while blocked held the peers up: the rank's own time.
  const double blocked = absl::ToDoubleSeconds(c.blocked - c.stalled_while_blocked);
  out->set_compute_seconds(std::max(0.0, absl::ToDoubleSeconds(c.elapsed) - blocked));
  out->set_wait_seconds(std::max(0.0, blocked));
  out->set_stalled_seconds(absl::ToDoubleSeconds(c.stalled));
  for (const comm::CollectiveSummary& s : c.ops) {
    loom::v1::CollectiveTiming& t = *out->add_collectives();
    t.set_group(s.group);
    t.set_op(s.op);
    t.set_calls(s.calls);
    t.set_wait_seconds(absl::ToDoubleSeconds(s.blocked));
    t.set_first_arrival_seconds(absl::ToDoubleSeconds(s.first_arrival));
    t.set_last_arrival_seconds(absl::ToDoubleSeconds(s.last_arrival));
  }
}

void SetHoldings(const engine::SnapshotProgress& s, loom::v1::SnapshotHoldings* out) {
  out->Clear();
  for (int64_t step : s.own_steps) out->add_own_steps(step);
  out->set_ward_rank(s.ward_rank);
  for (int64_t step : s.ward_steps) out->add_ward_steps(step);
  out->set_snapshot_bytes(s.snapshot_bytes);
  out->set_copy_seconds(s.copy_seconds);
}

loom::v1::RankProgress StepReport(const engine::StepProgress& p) {
  loom::v1::RankProgress out;
  out.set_phase("step");
  out.set_step(p.step);
  out.set_loss(p.loss);
  if (p.val_loss.has_value()) {
    out.set_has_val_loss(true);
    out.set_val_loss(*p.val_loss);
  }
  out.set_tokens(p.tokens);
  out.set_step_seconds(p.step_seconds);
  out.set_tokens_per_second(p.tokens_per_second);
  // A GPU rank's memory is its device's; a CPU rank's, its resident set.
  out.set_memory_bytes(p.peak_device_bytes > 0 ? p.peak_device_bytes : p.peak_rss_bytes);
  out.set_flops_per_token(p.flops_per_token);
  out.set_lr(p.lr);
  out.set_grad_norm(p.grad_norm);
  if (p.moe) {  // [moe]
    loom::v1::MoeProgress& m = *out.mutable_moe();
    for (double n : p.moe->tokens_per_expert) m.add_tokens_per_expert(n);
    m.set_tokens_min(p.moe->tokens_min);
    m.set_tokens_max(p.moe->tokens_max);
    m.set_imbalance(p.moe->imbalance);
    m.set_dropped_fraction(p.moe->dropped_fraction);
    m.set_aux_loss(p.moe->aux_loss);
  }
  if (p.snapshot) SetHoldings(*p.snapshot, out.mutable_snapshots());
  out.set_skipped_steps(p.skipped_steps);
  out.set_bad_step(p.bad_step);
  return out;
}

loom::v1::RankProgress PhaseReport(const std::string& phase, int64_t step) {
  loom::v1::RankProgress out;
  out.set_phase(phase);
  out.set_step(step);
  if (phase == "resumed") out.set_resumed_step(step);
  return out;
}

}  // namespace loom::trainer
