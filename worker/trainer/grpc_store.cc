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

// A coordinator that restarts is briefly UNAVAILABLE; a store call retries
// through that window instead of failing the rank.
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

GrpcStore::GrpcStore(std::shared_ptr<grpc::Channel> channel, std::string store_namespace)
    : stub_(loom::v1::RankService::NewStub(std::move(channel))),
      namespace_(std::move(store_namespace)) {}

absl::Status GrpcStore::Set(const std::string& key, const std::string& value) {
  loom::v1::StoreSetRequest request;
  request.set_store_namespace(namespace_);
  request.set_key(key);
  request.set_value(value);
  grpc::Status status = WithRetry(absl::Now() + absl::Seconds(30), [&] {
    loom::v1::StoreSetResponse response;
    auto context = rpc::UnaryContext();
    return stub_->StoreSet(context.get(), request, &response);
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
    // The server answers at wait_ms; the extra second covers the round trip.
    auto context = rpc::UnaryContext(
        std::chrono::milliseconds(absl::ToInt64Milliseconds(left + absl::Seconds(1))));
    return stub_->StoreGet(context.get(), request, &response);
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
  grpc::Status status = stub_->StoreAdd(context.get(), request, &response);
  if (!status.ok()) return FromGrpc(status, absl::StrCat("add ", key));
  return response.value();
}

}  // namespace loom::trainer
