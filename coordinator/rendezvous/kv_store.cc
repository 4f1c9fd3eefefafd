#include "coordinator/rendezvous/kv_store.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/commit_gate.h"
#include "common/rpc/rank_entries.h"

namespace loom::coordinator {

KvStore::KvStore(rpc::StoreQuotas quotas, Clock clock)
    : quotas_(quotas), clock_(std::move(clock)), timer_([this] { TimerLoop(); }) {}

KvStore::~KvStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  timer_.join();
}

size_t KvStore::OpenNamespace(const std::string& ns, CommitFence fence,
                              const CarriedEntries* carried) {
  std::vector<std::pair<GetCallback, std::string>> ready;
  size_t copied = 0;
  {
    absl::MutexLock lock(&mu_);
    Namespace& space = namespaces_[ns];
    if (fence.until > space.fence.until) space.fence = std::move(fence);
    if (carried != nullptr) copied = CarryLocked(*carried, space, &ready);
  }
  // Outside the lock: they complete RPCs (only a namespace opened before
  // it was carried into can have any).
  for (auto& [done, value] : ready) done(std::move(value));
  return copied;
}

size_t KvStore::CarryLocked(const CarriedEntries& carried, Namespace& to,
                            std::vector<std::pair<GetCallback, std::string>>* ready) {
  auto store = [&](const std::string& key, const std::string& value) {
    for (GetCallback& done : StoreLocked(to, key, value)) ready->emplace_back(std::move(done), value);
  };
  size_t copied = 0;
  auto from = namespaces_.find(carried.from);
  if (from != namespaces_.end() && &from->second != &to) {
    const std::string prefix(rpc::kRankEntryPrefix);
    // The entries sit together in the ordered map: one walk over them only.
    for (auto it = from->second.values.lower_bound(prefix);
         it != from->second.values.end() && it->first.compare(0, prefix.size(), prefix) == 0;
         ++it) {
      const std::optional<int32_t> rank = rpc::RankOfEntry(it->first);
      if (!rank.has_value() || *rank >= static_cast<int32_t>(carried.survivors.size()) ||
          !carried.survivors[*rank] || to.values.count(it->first) > 0) {
        continue;
      }
      store(it->first, it->second);
      ++copied;
    }
  }
  // The survivors are in: each relaunched rank's add brings the count nearer
  // the world size.
  store(std::string(rpc::kJoinedKey),
        std::to_string(std::count(carried.survivors.begin(), carried.survivors.end(), true)));
  return copied;
}

absl::Status KvStore::CheckFenceLocked(const Namespace& space, const std::string& key) const {
  if (!rpc::IsCommitKey(key)) return absl::OkStatus();
  const absl::Duration left = space.fence.until - clock_();
  if (left <= absl::ZeroDuration()) return absl::OkStatus();
  // Rounded up: "0.0 s more" would invite a retry that is refused again.
  const double seconds = std::ceil(absl::ToDoubleSeconds(left) * 10) / 10;
  return absl::UnavailableError(absl::StrFormat(
      "checkpoint commit %s is held back for %.1f s more: %s (docs/fault_tolerance.md, "
      "Fencing); retry after that",
      key, seconds, space.fence.why));
}

absl::StatusOr<KvStore::Namespace*> KvStore::FindLocked(const std::string& ns) {
  auto it = namespaces_.find(ns);
  if (it == namespaces_.end()) {
    // The name is not echoed: it may be a guess at someone else's.
    return absl::NotFoundError(
        "store_namespace is not the namespace of a live attempt (it is delivered in the rank's "
        "assignment)");
  }
  return &it->second;
}

absl::Status KvStore::CheckQuotaLocked(const Namespace& space, const std::string& ns,
                                       const std::string& key, size_t value_bytes) const {
  if (static_cast<int64_t>(key.size()) > quotas_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("key is ", key.size(),
                                                   " bytes; rendezvous keys are at most ",
                                                   quotas_.max_key_bytes));
  }
  if (static_cast<int64_t>(value_bytes) > quotas_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("value is ", value_bytes,
                                                     " bytes; rendezvous values are at most ",
                                                     quotas_.max_value_bytes));
  }
  auto it = space.values.find(key);
  const int64_t old_bytes =
      it == space.values.end() ? 0 : static_cast<int64_t>(key.size() + it->second.size());
  if (it == space.values.end() &&
      static_cast<int64_t>(space.values.size()) >= quotas_.max_keys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous namespace ", ns, " already holds ", space.values.size(), " keys (at most ",
        quotas_.max_keys, ")"));
  }
  const int64_t after = space.bytes - old_bytes + static_cast<int64_t>(key.size() + value_bytes);
  if (after > quotas_.max_namespace_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous namespace ", ns, " would hold ", after, " bytes (at most ",
        quotas_.max_namespace_bytes, ")"));
  }
  return absl::OkStatus();
}

std::vector<KvStore::GetCallback> KvStore::StoreLocked(Namespace& space, const std::string& key,
                                                      std::string value) {
  auto old = space.values.find(key);
  if (old != space.values.end()) space.bytes -= static_cast<int64_t>(key.size() + old->second.size());
  space.bytes += static_cast<int64_t>(key.size() + value.size());
  space.values[key] = std::move(value);
  std::vector<GetCallback> ready;
  auto waiting = space.waiters.find(key);
  if (waiting == space.waiters.end()) return ready;
  ready.reserve(waiting->second.size());
  for (Waiter& w : waiting->second) ready.push_back(std::move(w.done));
  space.waiting -= static_cast<int64_t>(waiting->second.size());
  space.waiters.erase(waiting);
  return ready;
}

absl::Status KvStore::Set(const std::string& ns, const std::string& key, std::string value) {
  std::vector<GetCallback> ready;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Namespace*> space = FindLocked(ns);
    if (!space.ok()) return space.status();
    if (absl::Status s = CheckFenceLocked(**space, key); !s.ok()) return s;
    if (absl::Status s = CheckQuotaLocked(**space, ns, key, value.size()); !s.ok()) return s;
    ready = StoreLocked(**space, key, value);
  }
  // Callbacks run outside the lock: they complete RPCs.
  for (auto& done : ready) done(value);
  return absl::OkStatus();
}

void KvStore::GetAsync(const std::string& ns, const std::string& key, absl::Time deadline,
                       GetCallback done) {
  absl::StatusOr<std::string> result = absl::DeadlineExceededError(
      absl::StrCat("rendezvous key ", key, " not set in ", ns));
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Namespace*> found = FindLocked(ns);
    if (!found.ok()) {
      result = found.status();
    } else {
      Namespace& space = **found;
      auto it = space.values.find(key);
      if (it != space.values.end()) {
        result = it->second;
      } else if (absl::Now() < deadline) {
        if (space.waiting < quotas_.max_waiters) {
          space.waiters[key].push_back({key, deadline, std::move(done)});
          ++space.waiting;
          return;
        }
        result = absl::ResourceExhaustedError(
            absl::StrCat("rendezvous namespace ", ns, " already has ", space.waiting,
                         " waiting gets (at most ", quotas_.max_waiters, ")"));
      }
    }
  }
  // Outside the lock: done completes an RPC.
  done(std::move(result));
}

absl::StatusOr<std::string> KvStore::Get(const std::string& ns, const std::string& key,
                                         absl::Duration timeout) {
  absl::Mutex done_mu;
  bool finished = false;
  absl::StatusOr<std::string> result;
  GetAsync(ns, key, absl::Now() + timeout, [&](absl::StatusOr<std::string> value) {
    absl::MutexLock lock(&done_mu);
    result = std::move(value);
    finished = true;
  });
  absl::MutexLock lock(&done_mu);
  done_mu.Await(absl::Condition(&finished));
  return result;
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& ns, const std::string& key,
                                     int64_t delta) {
  int64_t value = delta;
  std::vector<GetCallback> ready;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Namespace*> found = FindLocked(ns);
    if (!found.ok()) return found.status();
    Namespace& space = **found;
    if (absl::Status s = CheckFenceLocked(space, key); !s.ok()) return s;
    auto it = space.values.find(key);
    if (it != space.values.end()) {
      int64_t old = 0;
      if (!absl::SimpleAtoi(it->second, &old)) {
        return absl::FailedPreconditionError(
            absl::StrCat("rendezvous key ", key, " holds a value that is not a number"));
      }
      value = old + delta;
    }
    const std::string text = std::to_string(value);
    if (absl::Status s = CheckQuotaLocked(space, ns, key, text.size()); !s.ok()) return s;
    ready = StoreLocked(space, key, text);
  }
  for (auto& done : ready) done(std::to_string(value));
  return value;
}

void KvStore::DropNamespace(const std::string& ns) {
  std::vector<GetCallback> cancelled;
  {
    absl::MutexLock lock(&mu_);
    auto it = namespaces_.find(ns);
    if (it == namespaces_.end()) return;
    for (auto& [key, waiting] : it->second.waiters) {
      for (auto& w : waiting) cancelled.push_back(std::move(w.done));
    }
    namespaces_.erase(it);
  }
  for (auto& done : cancelled) {
    done(absl::CancelledError(absl::StrCat("rendezvous namespace ", ns, " was closed")));
  }
}

size_t KvStore::NamespaceCount() const {
  absl::MutexLock lock(&mu_);
  return namespaces_.size();
}

void KvStore::TimerLoop() {
  while (true) {
    std::vector<std::pair<std::string, GetCallback>> expired;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(50));
      if (stopping_) {
        for (auto& [name, space] : namespaces_) {
          for (auto& [key, waiting] : space.waiters) {
            for (auto& w : waiting) expired.emplace_back(w.key, std::move(w.done));
          }
          space.waiters.clear();
          space.waiting = 0;
        }
      } else {
        const absl::Time now = absl::Now();
        for (auto& [name, space] : namespaces_) {
          for (auto key = space.waiters.begin(); key != space.waiters.end();) {
            std::vector<Waiter>& waiting = key->second;
            // One pass per key: the expired move out, the rest stay in order.
            auto kept = std::stable_partition(waiting.begin(), waiting.end(),
                                              [now](const Waiter& w) { return w.deadline > now; });
            for (auto it = kept; it != waiting.end(); ++it) {
              expired.emplace_back(it->key + " in " + name, std::move(it->done));
            }
            space.waiting -= static_cast<int64_t>(waiting.end() - kept);
            waiting.erase(kept, waiting.end());
            key = waiting.empty() ? space.waiters.erase(key) : std::next(key);
          }
        }
      }
    }
    for (auto& [what, done] : expired) {
      done(absl::DeadlineExceededError(absl::StrCat("rendezvous key ", what, " was not set in time")));
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
  }
}

}  // namespace loom::coordinator
