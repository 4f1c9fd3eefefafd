// In-process node certificates for loom-loadgen: thousands of fake node
// agents each need a certificate whose CN is its node id (OU=node), signed by
// the cluster CA that scripts/make_certs.sh wrote. Forking openssl once per
// node would take minutes; OpenSSL's C API takes milliseconds.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace loom::loadgen {

struct PemIdentity {
  std::string ca_pem;    // the cluster CA certificate
  std::string cert_pem;  // this identity's certificate
  std::string key_pem;   // its private key (P-256)
};

class NodeCertFactory {
 public:
  // ca_dir holds ca.crt and ca.key (make_certs.sh's OUT_DIR/ca).
  static absl::StatusOr<NodeCertFactory> Load(const std::string& ca_dir);

  NodeCertFactory(NodeCertFactory&& other) noexcept;
  NodeCertFactory& operator=(NodeCertFactory&&) = delete;
  ~NodeCertFactory();

  // A fresh key and a certificate /O=loom/OU=<role>/CN=common_name valid for a day:
  // a node's (role "node"), or a user's (role "user": the scheduling run's
  // job owners, sched_run.h).
  absl::StatusOr<PemIdentity> Issue(const std::string& common_name, const std::string& role = "node");

 private:
  NodeCertFactory(std::string ca_pem, void* ca_cert, void* ca_key)
      : ca_pem_(std::move(ca_pem)), ca_cert_(ca_cert), ca_key_(ca_key) {}

  std::string ca_pem_;
  void* ca_cert_;  // X509*
  void* ca_key_;   // EVP_PKEY*
  long serial_ = 1;
};

}  // namespace loom::loadgen
