#include "common/rpc/tls_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_dir, "",
          "directory with ca.crt, tls.crt and tls.key (mutual TLS; scripts/make_certs.sh)");
ABSL_FLAG(std::string, tls_ca, "", "cluster CA certificate (overrides DIR/ca.crt)");
ABSL_FLAG(std::string, tls_cert, "", "this program's certificate (overrides DIR/tls.crt)");
ABSL_FLAG(std::string, tls_key, "", "this program's private key (overrides DIR/tls.key)");
ABSL_FLAG(bool, insecure, false, "plaintext gRPC without identities (prints a warning)");

namespace loom::rpc {

TlsFlagValues TlsFlagValuesFromFlags(const std::string& fallback_dir) {
  TlsFlagValues values;
  values.tls_dir = absl::GetFlag(FLAGS_tls_dir);
  values.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  values.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  values.tls_key = absl::GetFlag(FLAGS_tls_key);
  values.insecure = absl::GetFlag(FLAGS_insecure);
  if (values.tls_dir.empty() && values.tls_ca.empty() && values.tls_cert.empty() &&
      values.tls_key.empty() && !values.insecure) {
    values.tls_dir = fallback_dir;
  }
  return values;
}

}  // namespace loom::rpc
