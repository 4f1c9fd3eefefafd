#include "coordinator/rendezvous/kv_store.h"

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::coordinator {

KvStore::KvStore() : timer_([this] { TimerLoop(); }) {}

KvStore::~KvStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  timer_.join();
}

std::vector<KvStore::GetCallback> KvStore::StoreLocked(Namespace& space, const std::string& key,
                                                      std::string value) {
  space.values[key] = std::move(value);
  std::vector<GetCallback> ready;
  for (auto it = space.waiters.begin(); it != space.waiters.end();) {
    if (it->key == key) {
      ready.push_back(std::move(it->done));
      it = space.waiters.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

void KvStore::Set(const std::string& ns, const std::string& key, std::string value) {
  std::vector<GetCallback> ready;
  {
    absl::MutexLock lock(&mu_);
    ready = StoreLocked(namespaces_[ns], key, value);
  }
  // Callbacks run outside the lock: they complete RPCs.
  for (auto& done : ready) done(value);
}

void KvStore::GetAsync(const std::string& ns, const std::string& key, absl::Time deadline,
                       GetCallback done) {
  std::optional<std::string> found;
  {
    absl::MutexLock lock(&mu_);
    Namespace& space = namespaces_[ns];
    auto it = space.values.find(key);
    if (it == space.values.end()) {
      if (absl::Now() < deadline) {
        space.waiters.push_back({key, deadline, std::move(done)});
        return;
      }
    } else {
      found = it->second;
    }
  }
  if (found) {
    done(*std::move(found));
    return;
  }
  done(absl::DeadlineExceededError(absl::StrCat("rendezvous key ", key, " not set in ", ns)));
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

int64_t KvStore::Add(const std::string& ns, const std::string& key, int64_t delta) {
  int64_t value = delta;
  std::vector<GetCallback> ready;
  {
    absl::MutexLock lock(&mu_);
    Namespace& space = namespaces_[ns];
    auto it = space.values.find(key);
    if (it != space.values.end()) value += std::stoll(it->second);
    ready = StoreLocked(space, key, std::to_string(value));
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
    for (auto& w : it->second.waiters) cancelled.push_back(std::move(w.done));
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
          for (auto& w : space.waiters) expired.emplace_back(w.key, std::move(w.done));
          space.waiters.clear();
        }
      } else {
        const absl::Time now = absl::Now();
        for (auto& [name, space] : namespaces_) {
          auto& waiters = space.waiters;
          for (auto it = waiters.begin(); it != waiters.end();) {
            if (it->deadline <= now) {
              expired.emplace_back(it->key + " in " + name, std::move(it->done));
              it = waiters.erase(it);
            } else {
              ++it;
            }
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
