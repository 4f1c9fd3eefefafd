#include "coordinator/auth/authenticate.h"

#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace loom::coordinator::auth {

absl::StatusOr<Role> RoleFromUnits(const std::vector<std::string>& organizational_units) {
  std::optional<Role> found;
  for (const std::string& unit : organizational_units) {
    std::optional<Role> role;
    if (unit == "admin") role = Role::kAdmin;
    if (unit == "user") role = Role::kUser;
    if (unit == "node") role = Role::kNode;
    if (unit == "coordinator") role = Role::kCoordinator;
    if (!role) continue;
    if (found && *found != *role) {
      return absl::UnauthenticatedError(
          "client certificate names more than one Loom role in its OU entries");
    }
    found = role;
  }
  if (!found) {
    return absl::UnauthenticatedError(
        "client certificate names no Loom role (an OU entry must be admin, user, node or "
        "coordinator)");
  }
  return *found;
}

absl::StatusOr<Identity> Authenticate(const PeerInfo& peer, const UserTokenStore* users,
                                      const RankTokenCodec* ranks) {
  if (!peer.tls) {
    return Identity{
        .role = Role::kInsecure, .name = "insecure", .rank = {}, .credential = Credential::kNone};
  }
  std::string token;
  if (!peer.authorization.empty()) {
    absl::string_view value = peer.authorization;
    if (!absl::ConsumePrefix(&value, "Bearer ") || value.empty()) {
      return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
    }
    token = std::string(value);
  }
  if (!token.empty() && UserTokenStore::LooksLikeUserToken(token)) {
    if (users == nullptr) return absl::UnauthenticatedError("bearer tokens are not enabled");
    absl::StatusOr<std::string> user = users->Lookup(token);
    if (!user.ok()) return user.status();
    return Identity{
        .role = Role::kUser, .name = *user, .rank = {}, .credential = Credential::kToken};
  }
  if (peer.common_name.empty()) {
    return absl::UnauthenticatedError(
        "no client certificate and no bearer token (pass --tls_dir with your certificate, or "
        "--token_file / LOOM_TOKEN)");
  }
  if (!IsValidName(peer.common_name)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "client certificate CN must be 1 to 64 characters of [A-Za-z0-9._-]"));
  }
  absl::StatusOr<Role> role = RoleFromUnits(peer.organizational_units);
  if (!role.ok()) return role.status();
  Identity identity{.role = *role, .name = peer.common_name, .rank = {}};
  if (token.empty()) return identity;
  if (!RankTokenCodec::LooksLikeRankToken(token) || ranks == nullptr) {
    return absl::UnauthenticatedError("bearer token refused: not a Loom token");
  }
  if (identity.role != Role::kNode) {
    return absl::UnauthenticatedError("a rank token is valid only with a node certificate");
  }
  absl::StatusOr<RankClaim> claim = ranks->Verify(token);
  if (!claim.ok()) return claim.status();
  if (claim->node_id != identity.name) {
    return absl::UnauthenticatedError(absl::StrCat("rank token refused: issued to another node, "
                                                   "not to ", identity.name));
  }
  identity.rank = *std::move(claim);
  return identity;
}

}  // namespace loom::coordinator::auth
