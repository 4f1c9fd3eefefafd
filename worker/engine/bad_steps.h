// Bad steps (docs/fault_tolerance.md, "Bad steps"): the run's judgement of
// each step after it is trained. Pure: the training run (training_run.cc)
// asks it whether an applied step's loss is a spike, to roll that step back,
// and tells it how every step ended, so that too many bad steps in a row
// fail the job naming them. Every rank sees the same losses (the loss is
// reduced over the job), so every rank reaches the same verdicts.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"

namespace loom::engine {

class BadStepPolicy {
 public:
  explicit BadStepPolicy(const spec::FaultToleranceSpec& f);

  // Why the applied step's loss is a spike: above loss_spike_factor times the
  // median of the last loss_spike_window applied steps (once 3 are in).
  // Empty: not one, the check is off, or the step was judged before (a step
  // replayed after a rollback).
  std::string SpikeReason(int64_t step, double loss) const;
  // How `step` ended: applied (bad_reason empty; its loss joins the window
  // and the run of bad steps ends) or not (extends the run). FAILED_PRECONDITION
  // naming the run's steps and reasons when it reaches max_bad_steps. A step
  // settled before (replayed) changes nothing.
  absl::Status Settle(int64_t step, const std::string& bad_reason, double loss);

  // The median of the window (0: empty).
  double RecentMedian() const;

 private:
  const double factor_;
  const size_t window_;
  const int64_t max_bad_;
  std::deque<double> recent_;  // applied steps' losses, oldest first
  std::vector<std::pair<int64_t, std::string>> run_;  // the current run of bad steps
  int64_t settled_ = 0;  // the newest step settled
};

}  // namespace loom::engine
