// A small client of etcd's v3 gRPC API (proto/etcd/etcd_v3.proto) for the
// coordinator's high availability: key ranges, transactions and leases. Every
// call has a deadline; a call that finds its member unreachable (UNAVAILABLE,
// DEADLINE_EXCEEDED) is tried on the next member, so losing one member of a
// cluster costs at most one deadline. Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcd_v3.grpc.pb.h"
#include "grpcpp/security/credentials.h"

namespace loom::coordinator::ha {

class EtcdClient {
 public:
  // endpoints: HOST:PORT of each member; credentials: TLS to etcd
  // (rpc::ChannelCredentials), or plaintext only where --etcd_insecure says so.
  EtcdClient(std::vector<std::string> endpoints,
             std::shared_ptr<grpc::ChannelCredentials> credentials,
             absl::Duration call_timeout = absl::Seconds(2));

  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& request);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request);
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> LeaseGrant(int64_t ttl_seconds);
  absl::Status LeaseRevoke(int64_t lease);
  // One keepalive of lease; returns the TTL etcd now gives it (<= 0: the
  // lease is gone, it expired or was revoked). No member is asked after
  // deadline: a leader renewing its lease must know by the time the lease
  // could have run out, not one call timeout per member later.
  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease,
                                         absl::Time deadline = absl::InfiniteFuture());

  // The value of one key; NOT_FOUND if it does not exist.
  absl::StatusOr<etcdserverpb::KeyValue> Get(const std::string& key);

  // Watches key from revision on: OK once it is deleted (or expired with its
  // lease), DEADLINE_EXCEEDED when timeout passed first, UNAVAILABLE when the
  // watch could not be kept (the caller reads the key again).
  absl::Status WaitForDelete(const std::string& key, int64_t revision, absl::Duration timeout);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  struct Member {
    std::string endpoint;
    std::shared_ptr<etcdserverpb::KV::Stub> kv;
    std::shared_ptr<etcdserverpb::Lease::Stub> lease;
    std::shared_ptr<etcdserverpb::Watch::Stub> watch;
    absl::Time connected_at;  // when the stubs' channel was made
  };
  // A fresh channel to the member: a gRPC channel whose connection attempts
  // failed while the member was starting (connection refused, then no
  // answer before it served) can stay unusable for many seconds after the
  // member is up; a new channel connects at once.
  Member Connect(const std::string& endpoint) const;
  // Runs call(member, context) on the current member, then on the others
  // while they are unreachable, each with the call timeout, none past deadline.
  template <typename Response, typename Call>
  absl::StatusOr<Response> OnAnyMember(const char* what, Call call,
                                       absl::Time deadline = absl::InfiniteFuture());

  std::vector<std::string> endpoints_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  absl::Mutex mu_;
  std::vector<Member> members_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> current_{0};
  const absl::Duration call_timeout_;
};

}  // namespace loom::coordinator::ha
