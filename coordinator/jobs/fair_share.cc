#include "coordinator/jobs/fair_share.h"

#include <algorithm>
#include <cmath>

namespace loom::coordinator::sched {

FairShareLedger::FairShareLedger(double half_life_s) : half_life_s_(std::max(half_life_s, 1e-9)) {}

double FairShareLedger::Decayed(const Entry& e, double now_s) const {
  // A clock read twice may step back by a hair: never grow usage for it.
  const double elapsed = std::max(0.0, now_s - e.at_s);
  return e.value * std::exp2(-elapsed / half_life_s_);
}

void FairShareLedger::Charge(const std::string& user, double device_seconds, double now_s) {
  Entry& e = users_[user];
  e.value = Decayed(e, now_s) + std::max(0.0, device_seconds);
  e.at_s = std::max(e.at_s, now_s);
}

double FairShareLedger::UsageAt(const std::string& user, double now_s) const {
  auto it = users_.find(user);
  return it == users_.end() ? 0.0 : Decayed(it->second, now_s);
}

std::map<std::string, double> FairShareLedger::UsageAt(double now_s) const {
  std::map<std::string, double> out;
  for (const auto& [user, e] : users_) out[user] = Decayed(e, now_s);
  return out;
}

}  // namespace loom::coordinator::sched
