// loomctl's identity verbs: whoami, token create|revoke.
#include <cstdio>

#include "absl/flags/flag.h"
#include "client/loomctl_context.h"
#include "client/loomctl_verbs.h"
#include "common/cli/parse_flags.h"
#include "common/rpc/rpc_settings.h"
#include "loom/v1/auth.grpc.pb.h"

ABSL_FLAG(std::string, user, "", "token create|revoke, quota set|get: the user");

namespace loom::client {

int RunWhoAmI(const Args&) {
  loom::v1::WhoAmIResponse response;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status =
      loom::v1::AuthService::NewStub(Channel())->WhoAmI(context.get(), {}, &response);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s (%s)\n", response.name().c_str(), response.role().c_str());
  return 0;
}

// token create --user=NAME prints the new token (only its hash is kept);
// token revoke --user=NAME ends every token of the user.
int RunToken(const Args& args) {
  if (args[1] != "create" && args[1] != "revoke") {
    loom::cli::UsageError("token needs create or revoke, not '" + args[1] + "'");
  }
  const std::string user = absl::GetFlag(FLAGS_user);
  if (user.empty()) loom::cli::UsageError("token " + args[1] + " needs --user=NAME");
  auto stub = loom::v1::AuthService::NewStub(Channel());
  auto context = loom::rpc::UnaryContext();
  if (args[1] == "create") {
    loom::v1::CreateTokenRequest request;
    request.set_user(user);
    loom::v1::CreateTokenResponse response;
    grpc::Status status = stub->CreateToken(context.get(), request, &response);
    if (!status.ok()) return RpcFail(status);
    std::printf("%s\n", response.token().c_str());
    return 0;
  }
  loom::v1::RevokeTokensRequest request;
  request.set_user(user);
  loom::v1::RevokeTokensResponse response;
  grpc::Status status = stub->RevokeTokens(context.get(), request, &response);
  if (!status.ok()) return RpcFail(status);
  std::printf("revoked %d token(s) of %s\n", response.revoked(), user.c_str());
  return 0;
}

}  // namespace loom::client
