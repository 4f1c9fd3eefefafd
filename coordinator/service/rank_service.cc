#include "coordinator/service/rank_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/auth/policy.h"
#include "coordinator/service/status_convert.h"
#include "coordinator/service/store_batch.h"

namespace loom::coordinator {
namespace {

grpc::Status RequireKey(const std::string& ns, const std::string& key) {
  if (ns.empty() || key.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "store_namespace and key must both be set");
  }
  return grpc::Status::OK;
}

constexpr char kMethodPrefix[] = "/loom.v1.RankService/";

}  // namespace

absl::Status RankServiceImpl::AdmitStore(const grpc::CallbackServerContext& context,
                                         const std::string& method, const std::string& ns,
                                         const std::string* written_key) const {
  absl::StatusOr<auth::Identity> caller = auth_->Admit(context, absl::StrCat(kMethodPrefix, method));
  if (!caller.ok()) return caller.status();
  if (absl::Status s = auth::AuthorizeStore(*caller, ns); !s.ok()) return s;
  return written_key != nullptr ? CheckEntryWriter(*caller, *written_key) : absl::OkStatus();
}

grpc::ServerUnaryReactor* RankServiceImpl::StoreSet(grpc::CallbackServerContext* context,
                                                    const loom::v1::StoreSetRequest* request,
                                                    loom::v1::StoreSetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status status = ToGrpc(AdmitStore(*context, "StoreSet", request->store_namespace(), &request->key()));
  if (status.ok()) status = RequireKey(request->store_namespace(), request->key());
  if (status.ok()) {
    status = ToGrpc(kv_->Set(request->store_namespace(), request->key(), request->value()));
  }
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* RankServiceImpl::StoreGet(grpc::CallbackServerContext* context,
                                                    const loom::v1::StoreGetRequest* request,
                                                    loom::v1::StoreGetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status status = ToGrpc(AdmitStore(*context, "StoreGet", request->store_namespace()));
  if (status.ok()) status = RequireKey(request->store_namespace(), request->key());
  if (!status.ok()) {
    reactor->Finish(status);
    return reactor;
  }
  // Wait no longer than the caller asked, nor past the call's own deadline.
  absl::Time deadline = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, request->wait_ms()));
  const absl::Time call_deadline = absl::FromChrono(context->deadline());
  deadline = std::min(deadline, call_deadline);
  kv_->GetAsync(request->store_namespace(), request->key(), deadline,
                [reactor, response](absl::StatusOr<std::string> value) {
                  if (value.ok()) {
                    response->set_value(*std::move(value));
                    reactor->Finish(grpc::Status::OK);
                  } else {
                    reactor->Finish(ToGrpc(value.status()));
                  }
                });
  return reactor;
}

grpc::ServerUnaryReactor* RankServiceImpl::StoreAdd(grpc::CallbackServerContext* context,
                                                    const loom::v1::StoreAddRequest* request,
                                                    loom::v1::StoreAddResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status status = ToGrpc(AdmitStore(*context, "StoreAdd", request->store_namespace(), &request->key()));
  if (status.ok()) status = RequireKey(request->store_namespace(), request->key());
  if (status.ok()) {
    absl::StatusOr<int64_t> value =
        kv_->Add(request->store_namespace(), request->key(), request->delta());
    if (value.ok()) {
      response->set_value(*value);
    } else {
      status = ToGrpc(value.status());
    }
  }
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* RankServiceImpl::StoreBatch(grpc::CallbackServerContext* context,
                                                      const loom::v1::StoreBatchRequest* request,
                                                      loom::v1::StoreBatchResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The call is the node's; each op is then admitted with its own rank token.
  absl::Status status = auth_->Admit(*context, absl::StrCat(kMethodPrefix, "StoreBatch")).status();
  if (status.ok()) status = CheckStoreBatch(*request);
  if (status.ok()) {
    const auth::PeerInfo peer = auth_->Peer(*context);
    ApplyStoreBatch(
        *request,
        [this, &peer](const std::string& token, const std::string& method) {
          return auth_->AdmitWithToken(peer, token, method);
        },
        kv_, response);
  }
  reactor->Finish(ToGrpc(status));
  return reactor;
}

}  // namespace loom::coordinator
