#include "common/rpc/tls.h"

#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"

namespace loom::rpc {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "' (create certificates with scripts/make_certs.sh)"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (buffer.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' is not a PEM file"));
  }
  return buffer.str();
}

std::string InDir(const std::string& dir, const char* name) {
  if (dir.empty()) return "";
  return absl::StrCat(dir, dir.back() == '/' ? "" : "/", name);
}

}  // namespace

absl::StatusOr<TlsSettings> ResolveTls(const TlsFlagValues& flags) {
  const bool any_tls = !flags.tls_dir.empty() || !flags.tls_ca.empty() ||
                       !flags.tls_cert.empty() || !flags.tls_key.empty();
  TlsSettings settings;
  if (flags.insecure) {
    if (any_tls) {
      return absl::InvalidArgumentError(
          "--insecure and --tls_dir/--tls_ca/--tls_cert/--tls_key exclude each other");
    }
    settings.insecure = true;
    return settings;
  }
  settings.insecure = false;
  settings.ca_path = flags.tls_ca.empty() ? InDir(flags.tls_dir, "ca.crt") : flags.tls_ca;
  settings.cert_path = flags.tls_cert.empty() ? InDir(flags.tls_dir, "tls.crt") : flags.tls_cert;
  settings.key_path = flags.tls_key.empty() ? InDir(flags.tls_dir, "tls.key") : flags.tls_key;
  if (settings.ca_path.empty()) {
    return absl::InvalidArgumentError(
        "mutual TLS is the default: pass --tls_dir=DIR (ca.crt, tls.crt, tls.key; "
        "scripts/make_certs.sh creates them) or --insecure for plaintext");
  }
  if (flags.certificate_optional && flags.tls_cert.empty() && flags.tls_key.empty()) {
    // A token client given only a directory may lack tls.crt/tls.key there.
    std::ifstream cert(settings.cert_path);
    if (!cert) {
      settings.cert_path.clear();
      settings.key_path.clear();
    }
  }
  if (settings.cert_path.empty() != settings.key_path.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (settings.cert_path.empty() && !flags.certificate_optional) {
    return absl::InvalidArgumentError(
        "mutual TLS needs this program's certificate: --tls_dir=DIR with tls.crt and tls.key, "
        "or --tls_cert and --tls_key");
  }
  return settings;
}

std::vector<std::string> TlsArgs(const TlsSettings& settings) {
  if (settings.insecure) return {"--insecure"};
  std::vector<std::string> args = {absl::StrCat("--tls_ca=", settings.ca_path)};
  if (!settings.cert_path.empty()) {
    args.push_back(absl::StrCat("--tls_cert=", settings.cert_path));
    args.push_back(absl::StrCat("--tls_key=", settings.key_path));
  }
  return args;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsSettings& settings) {
  if (settings.insecure) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> ca = ReadPem(settings.ca_path, "--tls_ca");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadPem(settings.cert_path, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(settings.key_path, "--tls_key");
  if (!key.ok()) return key.status();
  // REQUEST (not REQUIRE): a loomctl user may hold a bearer token instead of
  // a certificate. A certificate that is presented must verify against the
  // CA; a call with neither is refused by the handlers as UNAUTHENTICATED.
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = *ca;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsSettings& settings, const std::string& bearer_token) {
  if (settings.insecure) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadPem(settings.ca_path, "--tls_ca");
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *ca;
  if (!settings.cert_path.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(settings.cert_path, "--tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(settings.key_path, "--tls_key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  std::shared_ptr<grpc::ChannelCredentials> channel = grpc::SslCredentials(options);
  if (bearer_token.empty()) return channel;
  return grpc::CompositeChannelCredentials(channel, grpc::AccessTokenCredentials(bearer_token));
}

absl::StatusOr<std::string> CertificateCommonName(const std::string& cert_path) {
  absl::StatusOr<std::string> pem = ReadPem(cert_path, "--tls_cert");
  if (!pem.ok()) return pem.status();
  BIO* bio = BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
  X509* cert = bio != nullptr ? PEM_read_bio_X509(bio, nullptr, nullptr, nullptr) : nullptr;
  std::string name;
  if (cert != nullptr) {
    char buffer[256] = {};
    const int length =
        X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buffer, sizeof(buffer));
    if (length > 0) name.assign(buffer, static_cast<size_t>(length));
    X509_free(cert);
  }
  if (bio != nullptr) BIO_free(bio);
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert: '", cert_path, "' has no readable subject CN"));
  }
  return name;
}

void WarnIfInsecure(const TlsSettings& settings, const std::string& program) {
  if (!settings.insecure) return;
  std::fprintf(stderr,
               "%s: WARNING: --insecure: plaintext gRPC without identities; anyone who reaches "
               "the port is trusted\n",
               program.c_str());
}

}  // namespace loom::rpc
