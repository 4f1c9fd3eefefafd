// Rank tokens: a bearer credential for one rank of one job attempt on one
// node, issued by the coordinator into the rank's assignment. Stateless (an
// HMAC-SHA256 over the claim with a key kept in the state directory), so the
// ranks of a running job keep working across a coordinator restart.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/auth/identity.h"

namespace loom::coordinator::auth {

class RankTokenCodec {
 public:
  // key: at least 32 secret bytes.
  explicit RankTokenCodec(std::string key) : key_(std::move(key)) {}

  // Loads the key from path, creating it (32 random bytes, mode 0600) first
  // if it does not exist.
  static absl::StatusOr<RankTokenCodec> LoadOrCreate(const std::string& path);

  std::string Issue(const RankClaim& claim) const;
  // The claim of a token this codec issued; UNAUTHENTICATED otherwise.
  absl::StatusOr<RankClaim> Verify(const std::string& token) const;

  static bool LooksLikeRankToken(const std::string& token);

 private:
  std::string key_;
};

}  // namespace loom::coordinator::auth
