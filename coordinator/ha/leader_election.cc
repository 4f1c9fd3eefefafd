#include "coordinator/ha/leader_election.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace loom::coordinator::ha {

LeaderElection::LeaderElection(EtcdClient* etcd, ElectionOptions options)
    : etcd_(etcd), options_(std::move(options)) {}

LeaderElection::~LeaderElection() {
  stop_renewing_.Notify();
  if (renewer_.joinable()) {
    renewer_.join();
    etcd_->LeaseRevoke(lease_).IgnoreError();
  }
}

etcdserverpb::Compare LeaderElection::Fence() const {
  etcdserverpb::Compare compare;
  compare.set_key(options_.leader_key);
  compare.set_target(etcdserverpb::Compare::CREATE);
  compare.set_result(etcdserverpb::Compare::EQUAL);
  compare.set_create_revision(create_revision_);
  return compare;
}

absl::Status LeaderElection::TryOnce(std::string* leader_seen, int64_t* seen_at_revision) {
  absl::StatusOr<etcdserverpb::RangeResponse> current = [&] {
    etcdserverpb::RangeRequest request;
    request.set_key(options_.leader_key);
    return etcd_->Range(request);
  }();
  if (!current.ok()) return current.status();
  if (current->kvs_size() > 0) {
    *leader_seen = current->kvs(0).value();
    *seen_at_revision = current->header().revision();
    return absl::FailedPreconditionError("another coordinator leads");
  }
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> granted =
      etcd_->LeaseGrant(absl::ToInt64Seconds(options_.lease_ttl));
  if (!granted.ok()) return granted.status();
  const int64_t lease = granted->id();

  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* absent = txn.add_compare();
  absent->set_key(options_.leader_key);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(options_.leader_key);
  put->set_value(options_.address);
  put->set_lease(lease);
  txn.add_failure()->mutable_request_range()->set_key(options_.leader_key);
  absl::StatusOr<etcdserverpb::TxnResponse> result = etcd_->Txn(txn);
  if (result.ok() && result->succeeded()) {
    lease_ = lease;
    // The key was created by this transaction, at its revision.
    create_revision_ = result->header().revision();
    return absl::OkStatus();
  }
  // The transaction may have been applied with its answer lost (then the key
  // carries this lease), or another candidate won the race.
  absl::StatusOr<etcdserverpb::KeyValue> now = etcd_->Get(options_.leader_key);
  if (now.ok() && now->lease() == lease) {
    lease_ = lease;
    create_revision_ = now->create_revision();
    return absl::OkStatus();
  }
  etcd_->LeaseRevoke(lease).IgnoreError();
  if (now.ok()) *leader_seen = now->value();
  if (!result.ok()) return result.status();
  return absl::FailedPreconditionError("another coordinator leads");
}

absl::Status LeaderElection::Campaign(const absl::Notification& stop,
                                      const std::function<void(const std::string&)>& on_leader,
                                      std::function<void(const std::string&)> on_lost) {
  std::string last_seen = "\x01";  // report the first observation
  bool etcd_reported = false;
  while (!stop.HasBeenNotified()) {
    std::string seen;
    int64_t seen_at_revision = 0;
    absl::Status status = TryOnce(&seen, &seen_at_revision);
    if (status.ok()) {
      on_lost_ = std::move(on_lost);
      renewer_ = std::thread([this] { Renew(); });
      return absl::OkStatus();
    }
    if (absl::IsUnavailable(status)) {
      if (!etcd_reported) {
        std::fprintf(stderr, "loom-coordinator: cannot reach etcd (%s); retrying\n",
                     std::string(status.message()).c_str());
        etcd_reported = true;
      }
    } else {
      etcd_reported = false;
    }
    if (seen != last_seen) {
      last_seen = seen;
      on_leader(seen);
    }
    // Another leads: wait for its key to go (a watch wakes at once; the
    // timeout bounds how long a stop waits), else poll.
    if (seen_at_revision > 0 &&
        etcd_->WaitForDelete(options_.leader_key, seen_at_revision + 1, absl::Seconds(1)).ok()) {
      continue;
    }
    if (!stop.HasBeenNotified()) stop.WaitForNotificationWithTimeout(options_.poll_interval);
  }
  return absl::CancelledError("stopped before leading");
}

void LeaderElection::Renew() {
  // Renew three times per TTL; the term is over once a whole TTL passed
  // without a renewal etcd confirmed (etcd may have expired the lease), or
  // etcd says the lease is gone.
  const absl::Duration interval = options_.lease_ttl / 3;
  absl::Time confirmed = absl::Now();
  while (!stop_renewing_.WaitForNotificationWithTimeout(interval)) {
    const absl::Time sent = absl::Now();
    absl::StatusOr<int64_t> ttl = etcd_->LeaseKeepAlive(lease_, confirmed + options_.lease_ttl);
    if (ttl.ok() && *ttl > 0) {
      confirmed = sent;
      continue;
    }
    std::string why;
    if (ttl.ok()) {
      why = "etcd says the leader lease expired";
    } else if (absl::Now() - confirmed >= options_.lease_ttl) {
      why = absl::StrCat("the leader lease could not be renewed for ",
                         absl::FormatDuration(absl::Now() - confirmed), ": ", ttl.status().message());
    } else {
      continue;  // try again (another member) before the lease can have expired
    }
    if (on_lost_) on_lost_(why);
    return;
  }
}

}  // namespace loom::coordinator::ha
