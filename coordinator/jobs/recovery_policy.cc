#include "coordinator/jobs/recovery_policy.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"

namespace loom::coordinator {
namespace {

// The budget of a kind and how much of it the job used.
std::pair<int64_t, int32_t> BudgetOf(const loom::v1::Job& job,
                                     const spec::FaultToleranceSpec& ft, FailureKind kind) {
  switch (kind) {
    case FailureKind::kCrash: return {ft.max_restarts, job.crash_restarts()};
    case FailureKind::kHang:
    case FailureKind::kStraggler: return {ft.hang_budget(), job.hang_restarts()};
    case FailureKind::kNodeLost: return {ft.node_budget(), job.node_restarts()};
    case FailureKind::kJobBroken: break;
  }
  return {0, 0};
}

}  // namespace

const char* FailureKindName(FailureKind kind) {
  switch (kind) {
    case FailureKind::kCrash: return "crash";
    case FailureKind::kHang: return "hang";
    case FailureKind::kNodeLost: return "lost-node";
    case FailureKind::kJobBroken: return "job-broken";
    case FailureKind::kStraggler: return "straggler";
  }
  return "";
}

std::string InPlaceRefusal(const RecoveryInput& input) {
  if (std::string spec = SpecRefusal(input.fault_tolerance); !spec.empty()) return spec;
  switch (input.job.state()) {
    case loom::v1::RUNNING: break;
    case loom::v1::RECOVERING: return "a second failure while recovering in place";
    default:
      return absl::StrCat("the attempt had not started training (",
                          loom::v1::JobState_Name(input.job.state()),
                          "): there is no snapshot to roll back to");
  }
  if (input.in_place == nullptr) return "no in-place request was given";
  return "";
}

RecoveryDecision DecideRecovery(const RecoveryInput& input) {
  const Failure& failure = input.failure;
  const spec::FaultToleranceSpec& ft = input.fault_tolerance;
  RecoveryDecision decision;
  // What the job caused never cordons a node.
  if (!failure.node_id.empty() && failure.kind != FailureKind::kJobBroken &&
      input.node_failures >= ft.cordon_after) {
    decision.cordon = true;
    decision.cordon_reason = absl::StrCat("failed job ", input.job.id(), " ",
                                          input.node_failures, " times");
  }
  // A slow rank is moved off its node at once, and the node takes no other.
  if (failure.kind == FailureKind::kStraggler && !failure.node_id.empty()) {
    decision.cordon = true;
    decision.cordon_reason = absl::StrCat("a straggler of job ", input.job.id(), ": ", failure.reason);
  }
  if (failure.kind == FailureKind::kJobBroken) {
    decision.message = failure.reason;
    return decision;
  }
  const auto [budget, used] = BudgetOf(input.job, ft, failure.kind);
  decision.budget = budget;
  const char* what = FailureKindName(failure.kind);
  if (used >= budget) {
    decision.message =
        absl::StrCat(failure.reason, " (", what, " restart budget of ", budget, " spent)");
    return decision;
  }
  decision.restart_number = used + 1;
  decision.incident_kind = failure.kind == FailureKind::kCrash       ? "crash"
                           : failure.kind == FailureKind::kHang      ? "hang"
                           : failure.kind == FailureKind::kStraggler ? "straggler"
                                                                     : "node_lost";
  decision.message =
      absl::StrCat(what, " restart ", decision.restart_number, " of ", budget, ": ", failure.reason);
  // Exponential backoff, so a failure that repeats at once does not spin.
  decision.backoff = absl::Seconds(
      std::min(60.0, ft.restart_backoff_s * std::pow(2.0, std::max<int32_t>(0, used))));
  decision.path = RecoveryPath::kWholeJob;
  decision.fallback_reason = InPlaceRefusal(input);
  if (!decision.fallback_reason.empty()) return decision;
  // A node cordoned now takes no relaunched rank either.
  std::optional<InPlaceRequest> cordoned;
  if (decision.cordon) {
    cordoned = *input.in_place;
    for (RelaunchNode& node : cordoned->nodes) {
      if (node.node_id == failure.node_id) node.cordoned = true;
    }
  }
  absl::StatusOr<InPlaceDecision> plan = PlanRelaunch(cordoned ? *cordoned : *input.in_place);
  if (!plan.ok()) {
    decision.fallback_reason = absl::StrCat("the in-place plan failed: ", plan.status().message());
    return decision;
  }
  if (!plan->in_place && !plan->spill) {
    decision.fallback_reason = plan->fallback_reason;
    return decision;
  }
  // A spill takes the in-place path's abort and reports too: the survivors
  // keep their snapshots until they have written the restore step.
  decision.path = RecoveryPath::kInPlace;
  decision.relaunch = *std::move(plan);
  return decision;
}

void CountRestart(loom::v1::Job& job, FailureKind kind) {
  switch (kind) {
    case FailureKind::kCrash: job.set_crash_restarts(job.crash_restarts() + 1); break;
    case FailureKind::kHang:
    case FailureKind::kStraggler: job.set_hang_restarts(job.hang_restarts() + 1); break;
    case FailureKind::kNodeLost: job.set_node_restarts(job.node_restarts() + 1); break;
    case FailureKind::kJobBroken: return;
  }
  job.set_restarts(job.restarts() + 1);
}

}  // namespace loom::coordinator
