#include "coordinator/service/caller_identity.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/auth/certificate_subject.h"
#include "coordinator/auth/policy.h"

namespace loom::coordinator {
namespace {

std::string FirstProperty(const grpc::AuthContext& context, const char* name) {
  std::vector<grpc::string_ref> values = context.FindPropertyValues(name);
  if (values.empty()) return "";
  return std::string(values.front().data(), values.front().size());
}

}  // namespace

auth::PeerInfo CallerAuth::Peer(const grpc::ServerContextBase& context) const {
  auth::PeerInfo peer;
  peer.tls = tls_;
  if (tls_) {
    std::shared_ptr<const grpc::AuthContext> auth_context = context.auth_context();
    // Properties exist only for a certificate the handshake verified against
    // the cluster CA (GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY).
    if (auth_context != nullptr && auth_context->IsPeerAuthenticated()) {
      // The subject's entries, not its string form (certificate_subject.h).
      absl::StatusOr<auth::CertificateSubject> subject =
          auth::SubjectOfPem(FirstProperty(*auth_context, GRPC_X509_PEM_CERT_PROPERTY_NAME));
      if (subject.ok()) {
        peer.common_name = absl::StrJoin(subject->common_names, ",");
        peer.organizational_units = std::move(subject->organizational_units);
      }
    }
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("authorization");
    if (it != metadata.end()) peer.authorization = std::string(it->second.data(), it->second.size());
  }
  return peer;
}

absl::StatusOr<auth::Identity> CallerAuth::Admit(const grpc::ServerContextBase& context,
                                                 const std::string& method) const {
  return Check(Peer(context), method);
}

absl::StatusOr<auth::Identity> CallerAuth::AdmitWithToken(auth::PeerInfo peer,
                                                          const std::string& token,
                                                          const std::string& method) const {
  peer.authorization = token.empty() ? "" : absl::StrCat("Bearer ", token);
  return Check(peer, method);
}

absl::StatusOr<auth::Identity> CallerAuth::Check(const auth::PeerInfo& peer,
                                                 const std::string& method) const {
  absl::StatusOr<auth::Identity> identity = auth::Authenticate(peer, users_, ranks_);
  if (!identity.ok()) return identity.status();
  if (absl::Status s = auth::AuthorizeMethod(*identity, method); !s.ok()) return s;
  return identity;
}

}  // namespace loom::coordinator
