// A verified client certificate's subject, read from its structured name
// entries (OpenSSL's X509_NAME) rather than from the subject as one string.
// The string form ("CN=a,OU=user,O=x") escapes separators inside values, so
// a reader that splits it at ',' or '/' took an O of "x,OU=admin" for an
// admin OU; entries cannot be confused that way.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::coordinator::auth {

struct CertificateSubject {
  std::vector<std::string> common_names;         // every CN entry, in order
  std::vector<std::string> organizational_units; // every OU entry, in order
};

// The subject of the first certificate in `pem` (gRPC's x509_pem_cert of a
// peer it verified); UNAUTHENTICATED when it does not parse.
absl::StatusOr<CertificateSubject> SubjectOfPem(std::string_view pem);

}  // namespace loom::coordinator::auth
