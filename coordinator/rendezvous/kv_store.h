// The rendezvous key-value store: one namespace per job attempt, so a new
// attempt never sees the keys of the one before it. Gets that wait complete
// asynchronously (a callback), so a waiting rank holds no server thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom::coordinator {

class KvStore {
 public:
  using GetCallback = std::function<void(absl::StatusOr<std::string>)>;

  KvStore();
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  void Set(const std::string& ns, const std::string& key, std::string value);
  // Calls done with the value once the key exists, or DEADLINE_EXCEEDED at
  // deadline. done may run on the caller's thread, a Set caller's thread, or
  // the store's timer thread; it must not call back into the store.
  void GetAsync(const std::string& ns, const std::string& key, absl::Time deadline,
                GetCallback done);
  // Blocking form of GetAsync, for tests and in-process users.
  absl::StatusOr<std::string> Get(const std::string& ns, const std::string& key,
                                  absl::Duration timeout);
  int64_t Add(const std::string& ns, const std::string& key, int64_t delta);
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
    std::vector<Waiter> waiters;
  };
  // Stores the value and takes the waiters it satisfies; the caller runs them
  // after releasing mu_.
  std::vector<GetCallback> StoreLocked(Namespace& space, const std::string& key, std::string value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  mutable absl::Mutex mu_;
  std::map<std::string, Namespace> namespaces_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace loom::coordinator
