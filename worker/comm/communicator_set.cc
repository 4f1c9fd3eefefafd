#include "worker/comm/communicator_set.h"

namespace loom::comm {

Communicator* CommunicatorSet::Add(std::unique_ptr<Communicator> communicator) {
  if (communicator == nullptr) return nullptr;
  Communicator* added = communicator.get();
  std::optional<std::string> reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    members_.push_back(std::move(communicator));
    reason = aborted_;
  }
  if (reason.has_value()) added->Abort(*reason);
  return added;
}

void CommunicatorSet::Abort(const std::string& reason) {
  std::vector<Communicator*> targets;
  std::string first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.has_value()) aborted_ = reason;
    first = *aborted_;
    for (const auto& m : members_) targets.push_back(m.get());
  }
  // Members are never removed, so the pointers stay valid while the set lives.
  for (Communicator* c : targets) c->Abort(first);
}

bool CommunicatorSet::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_.has_value();
}

std::string CommunicatorSet::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_.value_or("");
}

std::vector<Communicator*> CommunicatorSet::members() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Communicator*> out;
  for (const auto& m : members_) out.push_back(m.get());
  return out;
}

}  // namespace loom::comm
