// Which rank a bearer token belongs to, for the agent's local endpoint
// (progress and store calls, agent_service.h): a rank proves who it is with
// the token the coordinator issued in its assignment. RankManager is the real
// implementation; tests may use their own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom::agent {

struct RankIdentity {
  std::string job_id;
  int32_t attempt = 0;
  int32_t rank = 0;
  std::string store_namespace;  // the assignment's: the only one its store calls may use
};

class RankTokens {
 public:
  virtual ~RankTokens() = default;
  // The rank this agent launched, and still runs, whose token is `token`
  // (compared in constant time); nullopt for any other token.
  virtual std::optional<RankIdentity> RankForToken(std::string_view token) const = 0;
};

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
