#include "tools/loadgen/node_certs.h"

#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace loom::loadgen {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open (--ca_dir must hold ca.crt and ca.key)"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string ToPem(int (*write)(BIO*, void*), void* object) {
  BIO* bio = BIO_new(BIO_s_mem());
  write(bio, object);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(size));
  BIO_free(bio);
  return out;
}

bool AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

}  // namespace

absl::StatusOr<NodeCertFactory> NodeCertFactory::Load(const std::string& ca_dir) {
  absl::StatusOr<std::string> ca_pem = ReadFile(ca_dir + "/ca.crt");
  if (!ca_pem.ok()) return ca_pem.status();
  absl::StatusOr<std::string> key_pem = ReadFile(ca_dir + "/ca.key");
  if (!key_pem.ok()) return key_pem.status();
  BIO* bio = BIO_new_mem_buf(ca_pem->data(), static_cast<int>(ca_pem->size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  bio = BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr || key == nullptr) {
    X509_free(cert);
    EVP_PKEY_free(key);
    return absl::InvalidArgumentError(
        absl::StrCat(ca_dir, ": ca.crt or ca.key is not a PEM certificate / private key"));
  }
  return NodeCertFactory(*std::move(ca_pem), cert, key);
}

NodeCertFactory::NodeCertFactory(NodeCertFactory&& other) noexcept
    : ca_pem_(std::move(other.ca_pem_)),
      ca_cert_(other.ca_cert_),
      ca_key_(other.ca_key_),
      serial_(other.serial_) {
  other.ca_cert_ = nullptr;
  other.ca_key_ = nullptr;
}

NodeCertFactory::~NodeCertFactory() {
  X509_free(static_cast<X509*>(ca_cert_));
  EVP_PKEY_free(static_cast<EVP_PKEY*>(ca_key_));
}

absl::StatusOr<PemIdentity> NodeCertFactory::Issue(const std::string& common_name,
                                                   const std::string& role) {
  auto* issuer = static_cast<X509*>(ca_cert_);
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  if (key == nullptr || cert == nullptr) {
    EVP_PKEY_free(key);
    X509_free(cert);
    return absl::InternalError("OpenSSL could not create a key or certificate");
  }
  // Random high bits keep serials unique across loadgen runs with one CA.
  unsigned char random[8];
  RAND_bytes(random, sizeof(random));
  BIGNUM* serial = BN_bin2bn(random, sizeof(random), nullptr);
  BN_add_word(serial, static_cast<BN_ULONG>(serial_++));
  BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert));
  BN_free(serial);
  X509_set_version(cert, 2);
  X509_gmtime_adj(X509_getm_notBefore(cert), -300);
  X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  auto add = [&](const char* field, const std::string& value) {
    X509_NAME_add_entry_by_txt(name, field, MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1, 0);
  };
  add("O", "loom");
  add("OU", role);
  add("CN", common_name);
  X509_set_issuer_name(cert, X509_get_subject_name(issuer));
  const bool ok = AddExtension(cert, issuer, NID_basic_constraints, "critical,CA:FALSE") &&
                  AddExtension(cert, issuer, NID_key_usage, "critical,digitalSignature,keyEncipherment") &&
                  AddExtension(cert, issuer, NID_ext_key_usage, "clientAuth") &&
                  X509_sign(cert, static_cast<EVP_PKEY*>(ca_key_), EVP_sha256()) > 0;
  PemIdentity out;
  if (ok) {
    out.ca_pem = ca_pem_;
    out.cert_pem = ToPem(reinterpret_cast<int (*)(BIO*, void*)>(&PEM_write_bio_X509), cert);
    BIO* bio = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
    char* data = nullptr;
    const long size = BIO_get_mem_data(bio, &data);
    out.key_pem.assign(data, static_cast<size_t>(size));
    BIO_free(bio);
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  if (!ok) return absl::InternalError(absl::StrCat("signing the certificate of ", common_name, " failed"));
  return out;
}

}  // namespace loom::loadgen
