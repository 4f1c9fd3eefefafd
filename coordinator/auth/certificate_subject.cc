#include "coordinator/auth/certificate_subject.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

namespace loom::coordinator::auth {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};

// An entry's value as UTF-8 bytes, exactly (a NUL inside stays inside, and
// the name check refuses it later).
std::string EntryText(const X509_NAME_ENTRY* entry) {
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(entry));
  if (n < 0 || utf8 == nullptr) return std::string("\0", 1);  // unreadable: never a valid name
  std::string out(reinterpret_cast<const char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return out;
}

}  // namespace

absl::StatusOr<CertificateSubject> SubjectOfPem(std::string_view pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::UnauthenticatedError("cannot read the client certificate");
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) return absl::UnauthenticatedError("cannot parse the client certificate");
  const X509_NAME* name = X509_get_subject_name(cert.get());
  CertificateSubject subject;
  for (int i = 0; i < X509_NAME_entry_count(name); ++i) {
    const X509_NAME_ENTRY* entry = X509_NAME_get_entry(name, i);
    switch (OBJ_obj2nid(X509_NAME_ENTRY_get_object(entry))) {
      case NID_commonName:
        subject.common_names.push_back(EntryText(entry));
        break;
      case NID_organizationalUnitName:
        subject.organizational_units.push_back(EntryText(entry));
        break;
      default:
        break;
    }
  }
  return subject;
}

}  // namespace loom::coordinator::auth
