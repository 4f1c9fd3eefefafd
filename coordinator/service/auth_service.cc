#include "coordinator/service/auth_service.h"

#include <cstdio>

#include "coordinator/service/status_convert.h"

namespace loom::coordinator {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(status));
  return reactor;
}

absl::Status Busy() {
  return absl::ResourceExhaustedError("too many token changes wait to be stored; retry");
}

absl::Status NeedTokens(const auth::UserTokenStore* tokens) {
  if (tokens != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError("bearer tokens need TLS; this coordinator runs --insecure");
}

}  // namespace

grpc::ServerUnaryReactor* AuthServiceImpl::CreateToken(grpc::CallbackServerContext* context,
                                                       const loom::v1::CreateTokenRequest* request,
                                                       loom::v1::CreateTokenResponse* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, "/loom.v1.AuthService/CreateToken");
  if (!caller.ok()) return Done(context, caller.status());
  if (absl::Status s = NeedTokens(tokens_); !s.ok()) return Done(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool queued = writes_.TrySubmit([this, request, response, reactor, who = caller->name] {
    absl::StatusOr<std::string> token = tokens_->Create(request->user());
    if (!token.ok()) {
      reactor->Finish(ToGrpc(token.status()));
      return;
    }
    std::fprintf(stderr, "auth: %s created a token for user %s\n", who.c_str(),
                 request->user().c_str());
    response->set_user(request->user());
    response->set_token(*token);
    reactor->Finish(grpc::Status::OK);
  });
  if (!queued) reactor->Finish(ToGrpc(Busy()));
  return reactor;
}

grpc::ServerUnaryReactor* AuthServiceImpl::RevokeTokens(grpc::CallbackServerContext* context,
                                                        const loom::v1::RevokeTokensRequest* request,
                                                        loom::v1::RevokeTokensResponse* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, "/loom.v1.AuthService/RevokeTokens");
  if (!caller.ok()) return Done(context, caller.status());
  if (absl::Status s = NeedTokens(tokens_); !s.ok()) return Done(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool queued = writes_.TrySubmit([this, request, response, reactor, who = caller->name] {
    absl::StatusOr<int> revoked = tokens_->Revoke(request->user());
    if (!revoked.ok()) {
      reactor->Finish(ToGrpc(revoked.status()));
      return;
    }
    std::fprintf(stderr, "auth: %s revoked %d token(s) of user %s\n", who.c_str(), *revoked,
                 auth::IsValidName(request->user()) ? request->user().c_str() : "(invalid name)");
    // What the revoked tokens opened ends too.
    if (streams_ != nullptr) streams_->EndAll(request->user());
    response->set_revoked(*revoked);
    reactor->Finish(grpc::Status::OK);
  });
  if (!queued) reactor->Finish(ToGrpc(Busy()));
  return reactor;
}

grpc::ServerUnaryReactor* AuthServiceImpl::WhoAmI(grpc::CallbackServerContext* context,
                                                  const loom::v1::WhoAmIRequest* request,
                                                  loom::v1::WhoAmIResponse* response) {
  absl::StatusOr<auth::Identity> caller = auth_->Admit(*context, "/loom.v1.AuthService/WhoAmI");
  if (!caller.ok()) return Done(context, caller.status());
  response->set_name(caller->name);
  response->set_role(std::string(auth::RoleName(caller->role)));
  return Done(context, absl::OkStatus());
}

}  // namespace loom::coordinator
