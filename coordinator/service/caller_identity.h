// The thin gRPC side of coordinator/auth: reads a call's AuthContext (the
// verified client certificate's x509_common_name and x509_subject) and its
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

  bool tls() const { return tls_; }

 private:
  bool tls_;
  const auth::UserTokenStore* users_;
  const auth::RankTokenCodec* ranks_;
};

}  // namespace loom::coordinator
