#include "coordinator/auth/authenticate.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace loom::coordinator::auth {

absl::StatusOr<Role> RoleFromSubject(const std::string& subject) {
  // RFC 2253 form ("CN=a,OU=user,O=loom"); Loom's names never need escapes,
  // and a subject that uses them names no role below.
  for (absl::string_view part : absl::StrSplit(subject, absl::ByAnyChar(",/"))) {
    part = absl::StripAsciiWhitespace(part);
    if (!absl::ConsumePrefix(&part, "OU=")) continue;
    if (part == "admin") return Role::kAdmin;
    if (part == "user") return Role::kUser;
    if (part == "node") return Role::kNode;
    if (part == "coordinator") return Role::kCoordinator;
  }
  return absl::UnauthenticatedError(absl::StrCat(
      "client certificate '", subject,
      "' names no Loom role (its OU must be admin, user, node or coordinator)"));
}

absl::StatusOr<Identity> Authenticate(const PeerInfo& peer, const UserTokenStore* users,
                                      const RankTokenCodec* ranks) {
  if (!peer.tls) return Identity{.role = Role::kInsecure, .name = "insecure", .rank = {}};
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
    return Identity{.role = Role::kUser, .name = *user, .rank = {}};
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
  absl::StatusOr<Role> role = RoleFromSubject(peer.subject);
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
