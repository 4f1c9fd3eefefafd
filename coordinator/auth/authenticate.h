// From what the transport says about a peer to an Identity. Pure: the gRPC
// adapter (coordinator/service/caller_identity.h) fills PeerInfo from the
// call's AuthContext and metadata; tests fill it by hand.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/auth/identity.h"
#include "coordinator/auth/rank_token.h"
#include "coordinator/auth/user_tokens.h"

namespace loom::coordinator::auth {

struct PeerInfo {
  bool tls = false;            // the server runs mutual TLS (false: --insecure)
  // From the structured subject of a verified client certificate
  // (certificate_subject.h): its CN entries joined by ',' ("" if none; more
  // than one is no valid name), and every OU entry.
  std::string common_name;
  std::vector<std::string> organizational_units;
  std::string authorization;   // the call's `authorization` metadata ("" if none)
};

// The role a certificate's OU entries grant (admin | user | node |
// coordinator; other OUs are ignored); UNAUTHENTICATED when they name none,
// or more than one.
absl::StatusOr<Role> RoleFromUnits(const std::vector<std::string>& organizational_units);

// Rules: plaintext (--insecure) is Role::kInsecure. Otherwise a user bearer
// token decides who the caller is; else the certificate does, and a node's
// certificate may carry a rank token for a rank of that node. A call with
// neither a certificate nor a token is UNAUTHENTICATED.
absl::StatusOr<Identity> Authenticate(const PeerInfo& peer, const UserTokenStore* users,
                                      const RankTokenCodec* ranks);

}  // namespace loom::coordinator::auth
