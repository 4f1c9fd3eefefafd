// Fair share (docs/scheduling.md): each user's recent use of the cluster, in
// device-seconds that decay with a half-life, so that among jobs of equal
// priority the user who used less lately goes first, and what was used a
// week ago hardly counts. Pure; the scheduler charges it on every pass and
// hands its view to the policy (scheduling_policy.h). In memory: a restarted
// coordinator starts everyone at zero.
#pragma once

#include <map>
#include <string>

namespace loom::coordinator::sched {

class FairShareLedger {
 public:
  // half_life_s > 0: usage halves every half_life_s seconds.
  explicit FairShareLedger(double half_life_s);

  // Adds device_seconds of use by `user` at now_s (seconds on any clock that
  // never goes back), decaying what was there.
  void Charge(const std::string& user, double device_seconds, double now_s);
  // The user's decayed usage at now_s; 0 for a user never charged.
  double UsageAt(const std::string& user, double now_s) const;
  // Every user's decayed usage at now_s.
  std::map<std::string, double> UsageAt(double now_s) const;

  double half_life_s() const { return half_life_s_; }

 private:
  struct Entry {
    double value = 0;
    double at_s = 0;
  };
  double Decayed(const Entry& e, double now_s) const;

  double half_life_s_;
  std::map<std::string, Entry> users_;
};

}  // namespace loom::coordinator::sched
