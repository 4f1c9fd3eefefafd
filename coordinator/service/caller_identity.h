// The thin gRPC side of coordinator/auth: reads a call's AuthContext (the
// verified client certificate, x509_pem_cert, read by its subject entries) and its
// `authorization` metadata, authenticates, and applies the method-level rule.
// Handlers call Admit first and finish the call with its status if it fails.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/auth/authenticate.h"
#include "coordinator/auth/identity.h"
#include "grpcpp/grpcpp.h"

namespace loom::coordinator {

class CallerAuth {
 public:
  // tls: the server runs mutual TLS (false: --insecure, everyone is trusted).
  // users / ranks may be null (no tokens of that kind are accepted).
  CallerAuth(bool tls, const auth::UserTokenStore* users, const auth::RankTokenCodec* ranks)
      : tls_(tls), users_(users), ranks_(ranks) {}

  // For in-process tests: plaintext, everything allowed.
  static CallerAuth Insecure() { return CallerAuth(false, nullptr, nullptr); }

  // Who is calling, and whether they may call method (the full name,
  // "/loom.v1.JobService/ListJobs"). UNAUTHENTICATED or PERMISSION_DENIED.
  absl::StatusOr<auth::Identity> Admit(const grpc::ServerContextBase& context,
                                       const std::string& method) const;

  // What the transport says about the caller (certificate, authorization).
  auth::PeerInfo Peer(const grpc::ServerContextBase& context) const;
  // As Admit, for a caller seen as `peer` but carrying `token` (a rank
  // token, "" for none) instead of its call's own authorization: one op of a
  // StoreBatch is admitted exactly as a single call carrying its token.
  absl::StatusOr<auth::Identity> AdmitWithToken(auth::PeerInfo peer, const std::string& token,
                                                const std::string& method) const;

  bool tls() const { return tls_; }

 private:
  absl::StatusOr<auth::Identity> Check(const auth::PeerInfo& peer, const std::string& method) const;

  bool tls_;
  const auth::UserTokenStore* users_;
  const auth::RankTokenCodec* ranks_;
};

}  // namespace loom::coordinator
