#include "worker/trainer/grpc_store.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/security/credentials.h"

namespace loom::trainer {
namespace {

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("rendezvous store: ", what, ": ", status.error_message()));
}

// The agent retries through a coordinator's restart or failover itself; this
// covers the agent's own socket being briefly away (the agent restarting).
template <typename Call>
grpc::Status WithRetry(absl::Time give_up, Call call) {
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    grpc::Status status = call();
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() + backoff > give_up) {
      return status;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace

GrpcStore::GrpcStore(const std::string& agent, std::string rank_token,
                     std::string store_namespace)
    // Local credentials: the agent's socket is on this host; the rank token
    // says which rank calls.
    : agent_(loom::v1::AgentService::NewStub(
          grpc::CreateChannel(agent, grpc::experimental::LocalCredentials(UDS)))),
      authorization_("Bearer " + std::move(rank_token)),
      namespace_(std::move(store_namespace)) {}

std::unique_ptr<grpc::ClientContext> GrpcStore::Context(absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->AddMetadata("authorization", authorization_);
  return context;
}

absl::Status GrpcStore::Set(const std::string& key, const std::string& value) {
  loom::v1::StoreSetRequest request;
  request.set_store_namespace(namespace_);
  request.set_key(key);
  request.set_value(value);
  // The agent retries a set through UNAVAILABLE for 30 s; this bound is above it.
  grpc::Status status = WithRetry(absl::Now() + absl::Seconds(40), [&] {
    loom::v1::StoreSetResponse response;
    return agent_->StoreSet(Context(absl::Seconds(40)).get(), request, &response);
  });
  return status.ok() ? absl::OkStatus() : FromGrpc(status, absl::StrCat("set ", key));
}

absl::StatusOr<std::string> GrpcStore::Get(const std::string& key, absl::Duration timeout) {
  loom::v1::StoreGetRequest request;
  request.set_store_namespace(namespace_);
  request.set_key(key);
  const absl::Time give_up = absl::Now() + timeout;
  loom::v1::StoreGetResponse response;
  grpc::Status status = WithRetry(give_up, [&] {
    const absl::Duration left = std::max(give_up - absl::Now(), absl::ZeroDuration());
    request.set_wait_ms(absl::ToInt64Milliseconds(left));
    // The agent answers at wait_ms; the extra second covers the round trip.
    return agent_->StoreGet(Context(left + absl::Seconds(1)).get(), request, &response);
  });
  if (!status.ok()) return FromGrpc(status, absl::StrCat("get ", key));
  return response.value();
}

absl::StatusOr<int64_t> GrpcStore::Add(const std::string& key, int64_t delta) {
  loom::v1::StoreAddRequest request;
  request.set_store_namespace(namespace_);
  request.set_key(key);
  request.set_delta(delta);
  loom::v1::StoreAddResponse response;
  // Not retried: an add that reached the coordinator must not be applied twice.
  grpc::Status status = agent_->StoreAdd(Context(absl::Seconds(15)).get(), request, &response);
  if (!status.ok()) return FromGrpc(status, absl::StrCat("add ", key));
  return response.value();
}

}  // namespace loom::trainer
