// AuthService handlers: bearer tokens for users (admin only) and WhoAmI.
// Creating and revoking a token writes the hashes durably (an fsync, or an
// etcd transaction): that runs on a one-thread pool, never on a callback
// thread, and the call is answered once it is stored. Lookups never wait for
// it (user_tokens.h).
#pragma once

#include "coordinator/auth/user_tokens.h"
#include "coordinator/service/caller_identity.h"
#include "coordinator/service/token_streams.h"
#include "coordinator/service/work_pool.h"
#include "loom/v1/auth.grpc.pb.h"

namespace loom::coordinator {

class AuthServiceImpl final : public loom::v1::AuthService::CallbackService {
 public:
  // tokens may be null (--insecure): token calls then fail FAILED_PRECONDITION.
  // streams: where streams opened with user tokens are (ended when their
  // user's tokens are revoked); may be null.
  AuthServiceImpl(auth::UserTokenStore* tokens, const CallerAuth* auth,
                  TokenStreams* streams = nullptr)
      : tokens_(tokens), auth_(auth), streams_(streams), writes_(1, 16) {}

  grpc::ServerUnaryReactor* CreateToken(grpc::CallbackServerContext* context,
                                        const loom::v1::CreateTokenRequest* request,
                                        loom::v1::CreateTokenResponse* response) override;
  grpc::ServerUnaryReactor* RevokeTokens(grpc::CallbackServerContext* context,
                                         const loom::v1::RevokeTokensRequest* request,
                                         loom::v1::RevokeTokensResponse* response) override;
  grpc::ServerUnaryReactor* WhoAmI(grpc::CallbackServerContext* context,
                                   const loom::v1::WhoAmIRequest* request,
                                   loom::v1::WhoAmIResponse* response) override;

 private:
  auth::UserTokenStore* tokens_;
  const CallerAuth* auth_;
  TokenStreams* const streams_;
  WorkPool writes_;  // last: its thread stops before the members it uses go
};

}  // namespace loom::coordinator
