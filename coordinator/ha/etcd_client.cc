#include "coordinator/ha/etcd_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace loom::coordinator::ha {
namespace {

bool Unreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

EtcdClient::Member EtcdClient::Connect(const std::string& endpoint) const {
  grpc::ChannelArguments args;
  // A whole job list comes back in one Range.
  args.SetMaxReceiveMessageSize(-1);
  // This channel's own connections, not ones shared with earlier channels
  // to the same member (see Member).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(endpoint, credentials_, args);
  return {.endpoint = endpoint,
          .kv = etcdserverpb::KV::NewStub(channel),
          .lease = etcdserverpb::Lease::NewStub(channel),
          .watch = etcdserverpb::Watch::NewStub(channel),
          .connected_at = absl::Now()};
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints,
                       std::shared_ptr<grpc::ChannelCredentials> credentials,
                       absl::Duration call_timeout)
    : endpoints_(std::move(endpoints)),
      credentials_(std::move(credentials)),
      call_timeout_(call_timeout) {
  absl::MutexLock lock(&mu_);
  for (const std::string& endpoint : endpoints_) members_.push_back(Connect(endpoint));
}

template <typename Response, typename Call>
absl::StatusOr<Response> EtcdClient::OnAnyMember(const char* what, Call call,
                                                 absl::Time deadline) {
  grpc::Status last(grpc::StatusCode::DEADLINE_EXCEEDED, "no time left to ask a member");
  const size_t start = current_.load();
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t index = (start + i) % endpoints_.size();
    const absl::Time call_deadline = std::min(absl::Now() + call_timeout_, deadline);
    if (call_deadline <= absl::Now()) break;
    Member member;
    {
      absl::MutexLock lock(&mu_);
      member = members_[index];
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(call_deadline));
    Response response;
    last = call(member, context, response);
    if (last.ok()) {
      current_.store(index);
      return response;
    }
    if (!Unreachable(last)) break;
    // At most one new channel a second per member.
    absl::MutexLock lock(&mu_);
    if (absl::Now() - members_[index].connected_at > absl::Seconds(1)) {
      members_[index] = Connect(members_[index].endpoint);
    }
  }
  return absl::UnavailableError(absl::StrCat("etcd ", what, ": ", last.error_message(), " (code ",
                                             static_cast<int>(last.error_code()), ")"));
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(
    const etcdserverpb::RangeRequest& request) {
  return OnAnyMember<etcdserverpb::RangeResponse>(
      "Range", [&](Member& m, grpc::ClientContext& c, etcdserverpb::RangeResponse& r) {
        return m.kv->Range(&c, request, &r);
      });
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(const etcdserverpb::TxnRequest& request) {
  return OnAnyMember<etcdserverpb::TxnResponse>(
      "Txn", [&](Member& m, grpc::ClientContext& c, etcdserverpb::TxnResponse& r) {
        return m.kv->Txn(&c, request, &r);
      });
}

absl::StatusOr<etcdserverpb::LeaseGrantResponse> EtcdClient::LeaseGrant(int64_t ttl_seconds) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(ttl_seconds);
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> response =
      OnAnyMember<etcdserverpb::LeaseGrantResponse>(
          "LeaseGrant",
          [&](Member& m, grpc::ClientContext& c, etcdserverpb::LeaseGrantResponse& r) {
            return m.lease->LeaseGrant(&c, request, &r);
          });
  if (response.ok() && !response->error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd LeaseGrant: ", response->error()));
  }
  return response;
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  return OnAnyMember<etcdserverpb::LeaseRevokeResponse>(
             "LeaseRevoke",
             [&](Member& m, grpc::ClientContext& c, etcdserverpb::LeaseRevokeResponse& r) {
               return m.lease->LeaseRevoke(&c, request, &r);
             })
      .status();
}

absl::StatusOr<int64_t> EtcdClient::LeaseKeepAlive(int64_t lease, absl::Time deadline) {
  // One short stream per keepalive: simple, and the next one goes to another
  // member if this one is gone.
  absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> response =
      OnAnyMember<etcdserverpb::LeaseKeepAliveResponse>(
          "LeaseKeepAlive",
          [&](Member& m, grpc::ClientContext& c, etcdserverpb::LeaseKeepAliveResponse& r) {
            auto stream = m.lease->LeaseKeepAlive(&c);
            etcdserverpb::LeaseKeepAliveRequest request;
            request.set_id(lease);
            const bool exchanged = stream->Write(request) && stream->WritesDone() &&
                                   stream->Read(&r);
            grpc::Status status = stream->Finish();
            if (!status.ok()) return status;
            if (!exchanged) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed");
            return status;
          },
          deadline);
  if (!response.ok()) return response.status();
  return response->ttl();
}

absl::Status EtcdClient::WaitForDelete(const std::string& key, int64_t revision,
                                       absl::Duration timeout) {
  Member member;
  {
    absl::MutexLock lock(&mu_);
    member = members_[current_.load() % members_.size()];
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  auto stream = member.watch->Watch(&context);
  etcdserverpb::WatchRequest request;
  request.mutable_create_request()->set_key(key);
  request.mutable_create_request()->set_start_revision(revision);
  bool deleted = false;
  if (stream->Write(request)) {
    etcdserverpb::WatchResponse response;
    while (!deleted && stream->Read(&response)) {
      if (response.canceled()) break;  // e.g. the revision was compacted
      for (const etcdserverpb::Event& event : response.events()) {
        deleted = deleted || event.type() == etcdserverpb::Event::DELETE;
      }
    }
  }
  context.TryCancel();
  grpc::Status status = stream->Finish();
  if (deleted) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError(absl::StrCat("etcd watch of ", key));
  }
  return absl::UnavailableError(absl::StrCat("etcd watch of ", key, ": ", status.error_message()));
}

absl::StatusOr<etcdserverpb::KeyValue> EtcdClient::Get(const std::string& key) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  absl::StatusOr<etcdserverpb::RangeResponse> response = Range(request);
  if (!response.ok()) return response.status();
  if (response->kvs_size() == 0) return absl::NotFoundError(absl::StrCat("etcd key ", key));
  return response->kvs(0);
}

}  // namespace loom::coordinator::ha
