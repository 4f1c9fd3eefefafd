// The rendezvous key-value store: one namespace per job attempt, so a new
// attempt never sees the keys of the one before it. Gets that wait complete
// asynchronously (a callback), so a waiting rank holds no server thread.
// Namespaces exist only while their attempt is live (the scheduler opens one
// when it places an attempt and drops it when the attempt ends): a request
// into any other name is NOT_FOUND, so nothing can be stored for an attempt
// that does not exist yet. Each namespace has quotas (docs/limits.md).
//
// The commit gate (docs/fault_tolerance.md, "Fencing"): a namespace opened
// with a commit fence refuses writes of keys under rpc::kCommitKeyPrefix with
// UNAVAILABLE until the fence's time, naming the time left and why (an
// attempt that replaced a lost node's ranks waits out that node's lease, so
// nothing its stale ranks commit can land after the new attempt's commits).
// A dropped namespace refuses them as everything else: NOT_FOUND.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/store_quotas.h"

namespace loom::coordinator {

// Until when a namespace's checkpoint commits are held back, and why.
struct CommitFence {
  absl::Time until = absl::InfinitePast();  // past: no fence
  std::string why;  // e.g. "node n2 was lost and its lease may not have run out"
};

// What the namespace of an attempt placed in place takes over from the
// attempt it replaces (common/rpc/rank_entries.h): the rank entries of the
// ranks that survive, and the join count at their number.
struct CarriedEntries {
  std::string from;               // the replaced attempt's namespace
  std::vector<bool> survivors;    // by rank: true for a rank that keeps its process
};

class KvStore {
 public:
  using GetCallback = std::function<void(absl::StatusOr<std::string>)>;
  using Clock = std::function<absl::Time()>;

  // clock: the time the commit fence is compared with (tests pass their own).
  explicit KvStore(rpc::StoreQuotas quotas = {}, Clock clock = absl::Now);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Creates an empty namespace (if it exists, keeps its keys). With a fence,
  // commit keys are refused until fence.until (an open namespace keeps the
  // later of its fence and this one). With carried: the survivors' rank
  // entries are copied from carried->from (when it is still open; a key the
  // new namespace already holds is kept) and rpc::kJoinedKey is set to the
  // number of survivors. Returns the number of entries copied.
  size_t OpenNamespace(const std::string& ns, CommitFence fence = {},
                       const CarriedEntries* carried = nullptr);
  // NOT_FOUND for a namespace that is not open, RESOURCE_EXHAUSTED naming the
  // quota a write would break, UNAVAILABLE for a commit key behind the fence
  // (Set and Add alike).
  absl::Status Set(const std::string& ns, const std::string& key, std::string value);
  // Calls done with the value once the key exists, or DEADLINE_EXCEEDED at
  // deadline. done may run on the caller's thread, a Set caller's thread, or
  // the store's timer thread; it must not call back into the store.
  void GetAsync(const std::string& ns, const std::string& key, absl::Time deadline,
                GetCallback done);
  // Blocking form of GetAsync, for tests and in-process users.
  absl::StatusOr<std::string> Get(const std::string& ns, const std::string& key,
                                  absl::Duration timeout);
  absl::StatusOr<int64_t> Add(const std::string& ns, const std::string& key, int64_t delta);
  // Drops a namespace (an attempt that ended); its waiters get CANCELLED.
  void DropNamespace(const std::string& ns);
  size_t NamespaceCount() const;

 private:
  struct Waiter {
    std::string key;
    absl::Time deadline;
    GetCallback done;
  };
  struct Namespace {
    std::map<std::string, std::string> values;
    // By key: a store finds its waiters without scanning every other key's
    // (16,384 ranks wait on one key while 32,768 others are stored).
    std::map<std::string, std::vector<Waiter>> waiters;
    int64_t waiting = 0;  // gets in waiters
    int64_t bytes = 0;    // keys and values
    CommitFence fence;
  };
  // The namespace, or NOT_FOUND naming it.
  absl::StatusOr<Namespace*> FindLocked(const std::string& ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when storing value under key keeps the namespace within its quotas.
  absl::Status CheckQuotaLocked(const Namespace& space, const std::string& ns,
                                const std::string& key, size_t value_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE when key is a commit key and the namespace's fence is up.
  absl::Status CheckFenceLocked(const Namespace& space, const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores the value and takes the waiters it satisfies; the caller runs them
  // after releasing mu_.
  std::vector<GetCallback> StoreLocked(Namespace& space, const std::string& key, std::string value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies the survivors' entries into `to` (see OpenNamespace).
  size_t CarryLocked(const CarriedEntries& carried, Namespace& to,
                     std::vector<std::pair<GetCallback, std::string>>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  const rpc::StoreQuotas quotas_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Namespace> namespaces_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace loom::coordinator
