// From what the transport says about a peer to an Identity. Pure: the gRPC
// adapter (coordinator/service/caller_identity.h) fills PeerInfo from the
// call's AuthContext and metadata; tests fill it by hand.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/auth/identity.h"
#include "coordinator/auth/rank_token.h"
#include "coordinator/auth/user_tokens.h"

namespace loom::coordinator::auth {

struct PeerInfo {
  bool tls = false;            // the server runs mutual TLS (false: --insecure)
  std::string common_name;     // x509_common_name of a verified client certificate ("" if none)
  std::string subject;         // x509_subject, e.g. "CN=alice,OU=user"
  std::string authorization;   // the call's `authorization` metadata ("" if none)
};

// The role a certificate's subject grants (by its OU: admin | user | node |
// coordinator); UNAUTHENTICATED when it names none.
absl::StatusOr<Role> RoleFromSubject(const std::string& subject);

// Rules: plaintext (--insecure) is Role::kInsecure. Otherwise a user bearer
// token decides who the caller is; else the certificate does, and a node's
// certificate may carry a rank token for a rank of that node. A call with
// neither a certificate nor a token is UNAUTHENTICATED.
absl::StatusOr<Identity> Authenticate(const PeerInfo& peer, const UserTokenStore* users,
                                      const RankTokenCodec* ranks);

}  // namespace loom::coordinator::auth
