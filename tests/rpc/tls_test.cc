// common/rpc/tls: the flag rules (mutual TLS by default, --insecure
// explicit), and credentials and names read from real certificates.
#include "common/rpc/tls.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "gtest/gtest.h"

namespace loom::rpc {
namespace {

namespace fs = std::filesystem;

TEST(ResolveTlsTest, MutualTlsIsTheDefault) {
  absl::StatusOr<TlsSettings> none = ResolveTls({});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--insecure"), std::string::npos);
  EXPECT_NE(none.status().message().find("--tls_dir"), std::string::npos);

  absl::StatusOr<TlsSettings> dir = ResolveTls({.tls_dir = "/certs/node-a/"});
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_FALSE(dir->insecure);
  EXPECT_EQ(dir->ca_path, "/certs/node-a/ca.crt");
  EXPECT_EQ(dir->cert_path, "/certs/node-a/tls.crt");
  EXPECT_EQ(dir->key_path, "/certs/node-a/tls.key");

  absl::StatusOr<TlsSettings> single = ResolveTls({.tls_dir = "/d", .tls_ca = "/other/ca.pem"});
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->ca_path, "/other/ca.pem");
  EXPECT_EQ(single->cert_path, "/d/tls.crt");
}

TEST(ResolveTlsTest, InsecureIsExplicitAndExclusive) {
  absl::StatusOr<TlsSettings> insecure = ResolveTls({.insecure = true});
  ASSERT_TRUE(insecure.ok());
  EXPECT_TRUE(insecure->insecure);
  EXPECT_EQ(TlsArgs(*insecure), std::vector<std::string>{"--insecure"});
  EXPECT_FALSE(ResolveTls({.tls_dir = "/d", .insecure = true}).ok());
}

TEST(ResolveTlsTest, CertificateAndKeyGoTogether) {
  EXPECT_FALSE(ResolveTls({.tls_ca = "/ca", .tls_cert = "/c"}).ok());
  EXPECT_FALSE(ResolveTls({.tls_ca = "/ca"}).ok());  // a program needs its own certificate
  // A token client may have only the CA.
  absl::StatusOr<TlsSettings> token =
      ResolveTls({.tls_ca = "/ca", .certificate_optional = true});
  ASSERT_TRUE(token.ok());
  EXPECT_TRUE(token->cert_path.empty());
  EXPECT_EQ(TlsArgs(*token), std::vector<std::string>{"--tls_ca=/ca"});
}

TEST(TlsCredentialsTest, ReadsCertificatesFromMakeCerts) {
  const fs::path dir = fs::temp_directory_path() / ("loom-tls-test-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string command =
      std::string(LOOM_MAKE_CERTS) + " " + dir.string() + " --node=gpu-07 > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0);
  absl::StatusOr<TlsSettings> node = ResolveTls({.tls_dir = (dir / "node-gpu-07").string()});
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(*CertificateCommonName(node->cert_path), "gpu-07");
  EXPECT_TRUE(ChannelCredentials(*node, "token").ok());
  absl::StatusOr<TlsSettings> coordinator = ResolveTls({.tls_dir = (dir / "coordinator").string()});
  EXPECT_TRUE(ServerCredentials(*coordinator).ok());
  // A missing file names the flag.
  absl::StatusOr<TlsSettings> missing = ResolveTls({.tls_dir = (dir / "node-none").string()});
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> refused = ServerCredentials(*missing);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--tls_ca"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom::rpc
