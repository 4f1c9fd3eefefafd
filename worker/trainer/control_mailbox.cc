#include "worker/trainer/control_mailbox.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/trainer/stop_signal.h"

namespace loom::trainer {
namespace {

// A rank moves through few attempts; older entries are of no use.
constexpr size_t kRemembered = 16;

}  // namespace

void ControlMailbox::AbortLocked(int attempt, const std::string& reason) {
  if (!aborted_.emplace(attempt, reason).second) return;
  while (aborted_.size() > kRemembered) aborted_.erase(aborted_.begin());
}

void ControlMailbox::Post(const loom::v1::RankControl& message) {
  std::shared_ptr<comm::CommunicatorSet> to_abort;
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    int attempt = -1;
    if (message.has_stop() && message.stop().spill_step() > 0) {
      spills_.push_back(message.stop());
      while (spills_.size() > kRemembered) spills_.pop_front();
      return;
    }
    if (message.has_stop()) {
      if (!stop_.has_value()) stop_ = message.stop().reason();
      return;
    }
    if (message.has_trace()) {  // `loomctl trace`: recorded when the step begins
      trace_steps_.insert(message.trace().step());
      while (trace_steps_.size() > kRemembered) trace_steps_.erase(trace_steps_.begin());
      return;
    }
    if (message.has_abort()) {
      attempt = message.abort().attempt();
      reason = absl::StrCat("attempt ", attempt,
                            " aborted by the coordinator: ", message.abort().reason());
    } else if (message.has_enter_epoch()) {
      attempt = message.enter_epoch().from_attempt();
      reason = absl::StrCat("attempt ", attempt, " superseded by attempt ",
                            message.enter_epoch().attempt());
      epochs_.push_back(message.enter_epoch());
      while (epochs_.size() > kRemembered) epochs_.pop_front();
    } else {
      return;
    }
    AbortLocked(attempt, reason);
    if (armed_attempt_ == attempt) to_abort = armed_;
  }
  // Outside the lock: aborting a NCCL communicator can take a while.
  if (to_abort != nullptr) to_abort->Abort(reason);
}

void ControlMailbox::Arm(int attempt, std::shared_ptr<comm::CommunicatorSet> set) {
  std::optional<std::string> reason;
  {
    absl::MutexLock lock(&mu_);
    armed_attempt_ = attempt;
    armed_ = set;
    auto it = aborted_.find(attempt);
    if (it != aborted_.end()) reason = it->second;
  }
  if (reason.has_value() && set != nullptr) set->Abort(*reason);
}

void ControlMailbox::Disarm() {
  // Destroyed after the lock is released, when it is the last reference
  // (its members join their threads).
  std::shared_ptr<comm::CommunicatorSet> released;
  {
    absl::MutexLock lock(&mu_);
    armed_attempt_ = -1;
    released = std::move(armed_);
  }
}

bool ControlMailbox::TraceWanted(int64_t step) const {
  absl::MutexLock lock(&mu_);
  return trace_steps_.contains(step);
}

std::optional<std::string> ControlMailbox::AbortOf(int attempt) const {
  absl::MutexLock lock(&mu_);
  auto it = aborted_.find(attempt);
  if (it == aborted_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> ControlMailbox::StopRequested() const {
  {
    absl::MutexLock lock(&mu_);
    if (stop_.has_value()) return stop_;
  }
  if (StopSignalled()) return std::string("SIGUSR1 received");
  return std::nullopt;
}

absl::StatusOr<ControlMailbox::NextAttempt> ControlMailbox::WaitForNext(
    int from_attempt, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto epoch = [this, from_attempt]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::find_if(epochs_.begin(), epochs_.end(), [from_attempt](const auto& e) {
      return e.from_attempt() == from_attempt;
    });
  };
  auto spill = [this, from_attempt]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::find_if(spills_.begin(), spills_.end(), [from_attempt](const auto& s) {
      return s.attempt() == from_attempt;
    });
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return epoch() != epochs_.end() || spill() != spills_.end();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("no EnterEpoch moving on from attempt ", from_attempt, " came within ",
                     absl::FormatDuration(timeout), " after it stopped"));
  }
  NextAttempt next;
  if (auto it = epoch(); it != epochs_.end()) {
    next.epoch = *it;
    epochs_.erase(it);
  } else {
    auto s = spill();
    next.spill = *s;
    spills_.erase(s);
  }
  return next;
}

}  // namespace loom::trainer
