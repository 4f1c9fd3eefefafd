// Transport security of every Loom gRPC connection: which CA, certificate and
// key a program uses (or plaintext with --insecure), and the server and
// channel credentials built from them. The flags themselves live in
// tls_flags.h so that programs with their own flag parsing can share this.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace loom::rpc {

// Where a program's TLS material lives. A default-constructed value is
// plaintext (in-process tests); programs build theirs with ResolveTls, whose
// default is mutual TLS.
struct TlsSettings {
  bool insecure = true;
  std::string ca_path;    // the cluster CA, PEM
  std::string cert_path;  // this program's certificate, PEM (may be empty for a token client)
  std::string key_path;   // its private key, PEM
};

// The raw values of the TLS flags of common.md.
struct TlsFlagValues {
  std::string tls_dir;  // holds ca.crt, tls.crt, tls.key
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  bool insecure = false;
  // A client that authenticates with a bearer token needs only the CA.
  bool certificate_optional = false;
};

// Applies the rules: --insecure wins (no other TLS flag allowed with it);
// otherwise the CA is required, and cert and key together (or, when
// certificate_optional, neither). Errors name the flag and the rule.
absl::StatusOr<TlsSettings> ResolveTls(const TlsFlagValues& flags);

// The flags that give another program the same settings (an agent passes its
// own to the trainers it starts).
std::vector<std::string> TlsArgs(const TlsSettings& settings);

// Server side: mutual TLS that asks every client for a certificate and
// verifies it against the CA when one is given (a client without one can
// still authenticate with a bearer token; the handlers refuse everything
// else). Reads the files now.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsSettings& settings);

// Client side: the CA to verify the coordinator, this program's certificate,
// and, if bearer_token is not empty, `authorization: Bearer <token>` on every
// call. A token needs TLS (plaintext never carries one).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsSettings& settings, const std::string& bearer_token = "");

// The subject CN of a PEM certificate file (a node agent's id is its CN).
absl::StatusOr<std::string> CertificateCommonName(const std::string& cert_path);

// The one-line warning every program prints to stderr when it runs plaintext.
void WarnIfInsecure(const TlsSettings& settings, const std::string& program);

}  // namespace loom::rpc
