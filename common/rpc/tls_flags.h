// The TLS flags every Loom program shares (--tls_dir, --tls_ca, --tls_cert,
// --tls_key, --insecure; see common/rpc/tls.h for their rules). Linking
// loom_rpc_flags defines them once per program.
#pragma once

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "common/rpc/tls.h"

ABSL_DECLARE_FLAG(std::string, tls_dir);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(bool, insecure);

namespace loom::rpc {

// The flag names, for programs that parse their own command line.
inline constexpr const char* kTlsFlagNames[] = {"tls_dir", "tls_ca", "tls_cert", "tls_key",
                                                "insecure"};

// The current flag values; fallback_dir (e.g. $LOOM_TLS_DIR) is used when no
// TLS flag is set.
TlsFlagValues TlsFlagValuesFromFlags(const std::string& fallback_dir = "");

}  // namespace loom::rpc
