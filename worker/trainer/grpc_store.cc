#include "worker/trainer/grpc_store.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/rpc_settings.h"

namespace loom::trainer {
namespace {

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("rendezvous store: ", what, ": ", status.error_message()));
}

// A coordinator that restarts (or a standby that takes over) is briefly
// UNAVAILABLE; a store call retries through that window, on the leader,
// instead of failing the rank.
template <typename Call>
grpc::Status WithRetry(rpc::CoordinatorChannel& coordinators, absl::Time give_up, Call call) {
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    auto stub = loom::v1::RankService::NewStub(coordinators.channel());
    grpc::ClientContext* context = nullptr;
    grpc::Status status = call(*stub, &context);
    coordinators.Failed(status, context);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() + backoff > give_up) {
      return status;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace

GrpcStore::GrpcStore(std::shared_ptr<rpc::CoordinatorChannel> coordinators,
                     std::string store_namespace)
    : coordinators_(std::move(coordinators)),
      namespace_(std::move(store_namespace)) {}

absl::Status GrpcStore::Set(const std::string& key, const std::string& value) {
  loom::v1::StoreSetRequest request;
  request.set_store_namespace(namespace_);
  request.set_key(key);
  request.set_value(value);
  std::unique_ptr<grpc::ClientContext> context;
  grpc::Status status = WithRetry(
      *coordinators_, absl::Now() + absl::Seconds(30),
      [&](loom::v1::RankService::Stub& stub, grpc::ClientContext** used) {
        loom::v1::StoreSetResponse response;
        context = rpc::UnaryContext();
        *used = context.get();
        return stub.StoreSet(context.get(), request, &response);
      });
  return status.ok() ? absl::OkStatus() : FromGrpc(status, absl::StrCat("set ", key));
}

absl::StatusOr<std::string> GrpcStore::Get(const std::string& key, absl::Duration timeout) {
  loom::v1::StoreGetRequest request;
  request.set_store_namespace(namespace_);
  request.set_key(key);
  const absl::Time give_up = absl::Now() + timeout;
  loom::v1::StoreGetResponse response;
  std::unique_ptr<grpc::ClientContext> context;
  grpc::Status status = WithRetry(
      *coordinators_, give_up,
      [&](loom::v1::RankService::Stub& stub, grpc::ClientContext** used) {
        const absl::Duration left = std::max(give_up - absl::Now(), absl::ZeroDuration());
        request.set_wait_ms(absl::ToInt64Milliseconds(left));
        // The server answers at wait_ms; the extra second covers the round trip.
        context = rpc::UnaryContext(
            std::chrono::milliseconds(absl::ToInt64Milliseconds(left + absl::Seconds(1))));
        *used = context.get();
        return stub.StoreGet(context.get(), request, &response);
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
  // Not retried: an add that reached the server must not be applied twice.
  auto context = rpc::UnaryContext();
  grpc::Status status = loom::v1::RankService::NewStub(coordinators_->channel())
                            ->StoreAdd(context.get(), request, &response);
  coordinators_->Failed(status, context.get());
  if (!status.ok()) return FromGrpc(status, absl::StrCat("add ", key));
  return response.value();
}

}  // namespace loom::trainer
