#include "client/loomctl_context.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/cli/parse_flags.h"
#include "common/rpc/rpc_settings.h"
#include "common/rpc/tls_flags.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070",
          "address of loom-coordinator; several comma-separated (a highly available cluster): "
          "loomctl talks to the one that leads");
ABSL_FLAG(std::string, format, "",
          "output format: plan: text|json; list, status: text|json; watch: text|jsonl; "
          "export: hf");
ABSL_FLAG(std::string, token_file, "",
          "file holding a bearer token from `loomctl token create` (default: $LOOM_TOKEN)");

namespace loom::client {

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "loomctl: %s\n", message.c_str());
  return code;
}

int RpcFail(const grpc::Status& status) {
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  const bool unreachable = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  if (unreachable && loom::rpc::SplitAddresses(address).size() > 1) {
    return Fail(absl::StrCat("none of the coordinators at ", address, " leads or answers (",
                             status.error_message(), ")"));
  }
  if (unreachable) {
    return Fail(absl::StrCat("cannot reach the coordinator at ", address, " (",
                             status.error_message(),
                             "). Start one with: build/bin/loom-coordinator --listen=", address,
                             " --state_dir=DIR, or pass --coordinator=HOST:PORT"));
  }
  return Fail(status.error_message());
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream buffer;
  buffer << in.rdbuf();
  *out = buffer.str();
  return true;
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

namespace {

// The bearer token, if any: --token_file, else $LOOM_TOKEN.
std::string BearerToken() {
  const std::string path = absl::GetFlag(FLAGS_token_file);
  if (path.empty()) return Env("LOOM_TOKEN");
  std::string token;
  if (!ReadFile(path, &token)) loom::cli::UsageError("--token_file: cannot read " + path);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
    token.pop_back();
  }
  return token;
}

}  // namespace

loom::rpc::CoordinatorChannel& Coordinators() {
  static loom::rpc::CoordinatorChannel* coordinators = [] {
    // A token user needs only ca.crt in the TLS directory.
    loom::rpc::TlsFlagValues flags = loom::rpc::TlsFlagValuesFromFlags(Env("LOOM_TLS_DIR"));
    const std::string token = BearerToken();
    flags.certificate_optional = !token.empty();
    absl::StatusOr<loom::rpc::TlsSettings> tls = loom::rpc::ResolveTls(flags);
    if (!tls.ok()) loom::cli::UsageError(std::string(tls.status().message()));
    loom::rpc::WarnIfInsecure(*tls, "loomctl");
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        loom::rpc::ChannelCredentials(*tls, tls->insecure ? "" : token);
    if (!credentials.ok()) loom::cli::UsageError(std::string(credentials.status().message()));
    return new loom::rpc::CoordinatorChannel(absl::GetFlag(FLAGS_coordinator), *credentials);
  }();
  return *coordinators;
}

bool FindLeader() {
  loom::rpc::CoordinatorChannel& coordinators = Coordinators();
  if (!coordinators.several()) return true;
  // A standby takes over within its lease.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!coordinators.FindLeader()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  return true;
}

std::shared_ptr<grpc::Channel> Channel() {
  static const bool found = FindLeader();
  (void)found;  // if none leads, calls go to the first address and say so
  return Coordinators().channel();
}

std::unique_ptr<loom::v1::JobService::Stub> Stub() {
  return loom::v1::JobService::NewStub(Channel());
}

void RequireFormat(const std::string& verb, std::initializer_list<const char*> allowed) {
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format.empty()) return;
  std::string names;
  for (const char* name : allowed) {
    if (format == name) return;
    absl::StrAppend(&names, names.empty() ? "" : " or ", name);
  }
  loom::cli::UsageError("--format=" + format + " is not a " + verb + " format (" + names + ")");
}

}  // namespace loom::client
