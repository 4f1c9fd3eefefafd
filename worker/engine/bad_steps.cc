#include "worker/engine/bad_steps.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::engine {
namespace {

constexpr size_t kMinLosses = 3;  // fewer: no median worth comparing against

}  // namespace

BadStepPolicy::BadStepPolicy(const spec::FaultToleranceSpec& f)
    : factor_(f.loss_spike_factor),
      window_(static_cast<size_t>(std::max<int64_t>(f.loss_spike_window, kMinLosses))),
      max_bad_(std::max<int64_t>(f.max_bad_steps, 1)) {}

double BadStepPolicy::RecentMedian() const {
  if (recent_.empty()) return 0;
  std::vector<double> sorted(recent_.begin(), recent_.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

std::string BadStepPolicy::SpikeReason(int64_t step, double loss) const {
  if (factor_ <= 0 || step <= settled_ || recent_.size() < kMinLosses) return "";
  const double median = RecentMedian();
  if (!(loss > factor_ * median)) return "";
  return absl::StrFormat("loss spike (%.4f > %g x the median %.4f of the last %d steps)", loss,
                         factor_, median, recent_.size());
}

absl::Status BadStepPolicy::Settle(int64_t step, const std::string& bad_reason, double loss) {
  if (step <= settled_) return absl::OkStatus();
  settled_ = step;
  if (bad_reason.empty()) {
    run_.clear();
    if (std::isfinite(loss)) {
      recent_.push_back(loss);
      if (recent_.size() > window_) recent_.pop_front();
    }
    return absl::OkStatus();
  }
  run_.emplace_back(step, bad_reason);
  if (static_cast<int64_t>(run_.size()) < max_bad_) return absl::OkStatus();
  std::string steps;
  for (const auto& [s, why] : run_) {
    absl::StrAppend(&steps, steps.empty() ? "" : "; ", "step ", s, ": ", why);
  }
  return absl::FailedPreconditionError(
      absl::StrCat(run_.size(), " bad steps in a row (fault_tolerance.max_bad_steps=", max_bad_,
                   "), the job cannot go on: ", steps));
}

}  // namespace loom::engine
