// Which rank a bearer token belongs to, for the agent's local endpoint
// (progress, store and control calls, agent_service.h): a rank proves who it
// is with the token the coordinator issued for its current attempt (in its
// assignment, or in the EnterEpoch that moved it on). RankManager is the real
// implementation; tests may use their own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::agent {

struct RankIdentity {
  std::string job_id;
  int32_t attempt = 0;  // the attempt the rank is in now
  int32_t rank = 0;
  std::string store_namespace;  // its current attempt's: the only one its store calls may use
  // This agent's name for the launched process, the same across attempts
  // (its control stream follows it).
  uint64_t launch_id = 0;
  // Fenced: the agent's lease ran out since the rank was launched or last
  // resumed (or runs out now); nothing of the rank's is relayed until the
  // coordinator resumes it (lease.h).
  bool paused = false;
  // The lease generation the rank may relay in (lease.h); a call admitted in
  // one generation is not sent upstream in another.
  uint64_t lease_generation = 0;
};

class RankTokens {
 public:
  virtual ~RankTokens() = default;
  // The rank this agent launched, and still runs, whose current token is
  // `token` (compared in constant time); nullopt for any other token, also
  // for a token an EnterEpoch replaced.
  virtual std::optional<RankIdentity> RankForToken(std::string_view token) const = 0;
  // The launched rank `launch_id` as it is now (its attempt may have moved
  // on); nullopt once it has ended.
  virtual std::optional<RankIdentity> RankForLaunch(uint64_t launch_id) const = 0;
};

// OK while nothing of the rank's may be relayed to the coordinator, else
// UNAVAILABLE naming the rank and why (a caller retries after its resume).
inline absl::Status CheckNotPaused(const RankIdentity& rank) {
  if (!rank.paused) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "rank ", rank.rank, " of job ", rank.job_id, " attempt ", rank.attempt,
      " is paused: its node agent's lease ran out (no coordinator acknowledged a heartbeat in "
      "time), so the agent relays nothing of it until the coordinator resumes it"));
}

// Equal strings, in a time that depends only on their lengths (a token
// check must not tell an attacker how many leading bytes it got right).
inline bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

}  // namespace loom::agent
