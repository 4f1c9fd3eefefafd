// Leadership among several coordinators sharing one etcd (--state=etcd://).
// A candidate takes a lease and creates the leader key <prefix>/leader
// (value: the address clients reach it at) in a transaction that succeeds only
// if the key does not exist (create_revision == 0). The leader renews the
// lease; standbys watch the key (an etcd Watch from the revision they read it
// at, re-read at least every second) and campaign again once it is gone (its
// lease expired or was revoked). Leadership is one term: its proof is the leader
// key's create_revision (Fence()), which every write of the leader compares,
// so a coordinator whose term ended can no longer write even if it has not
// noticed yet. A leader that cannot renew its lease calls on_lost (the
// coordinator exits; its supervisor restarts it as a standby).
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/ha/etcd_client.h"

namespace loom::coordinator::ha {

struct ElectionOptions {
  std::string leader_key;  // <prefix>/leader
  std::string address;     // what this coordinator's leader key says: HOST:PORT for clients
  absl::Duration lease_ttl = absl::Seconds(5);
  absl::Duration poll_interval = absl::Milliseconds(300);
};

class LeaderElection {
 public:
  LeaderElection(EtcdClient* etcd, ElectionOptions options);
  ~LeaderElection();  // stops renewing (and revokes the lease: a clean handover)

  // Blocks until this coordinator leads (OK) or stop is notified (CANCELLED).
  // While another leads, on_leader(address) is called whenever the leader
  // seen changes ("" while there is none). After OK the lease is renewed on
  // a thread of this object; on_lost runs there if the term ends.
  absl::Status Campaign(const absl::Notification& stop,
                        const std::function<void(const std::string&)>& on_leader,
                        std::function<void(const std::string&)> on_lost);

  // The condition every write of this term carries: the leader key still has
  // the create_revision it had when this coordinator created it.
  etcdserverpb::Compare Fence() const;
  int64_t lease() const { return lease_; }

 private:
  // One attempt: OK when this coordinator now leads, FAILED_PRECONDITION when
  // another leads (leader_seen set to its address), UNAVAILABLE when etcd
  // could not be asked.
  absl::Status TryOnce(std::string* leader_seen, int64_t* seen_at_revision);
  void Renew();

  EtcdClient* const etcd_;
  const ElectionOptions options_;
  int64_t lease_ = 0;
  int64_t create_revision_ = 0;
  std::function<void(const std::string&)> on_lost_;
  absl::Notification stop_renewing_;
  std::thread renewer_;
};

}  // namespace loom::coordinator::ha
