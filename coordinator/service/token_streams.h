// The open streams of callers who authenticated with a user token, by user,
// so that revoking a user's tokens also ends what those tokens opened: a
// WatchJob stream checked its caller once, when it opened, and would
// otherwise keep streaming a job's progress to a revoked token for as long as
// the job runs. AuthService's RevokeTokens calls EndAll after the revocation
// is stored; JobService's streams Add themselves and Remove when done.
// Thread-safe; an end callback runs outside its lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"

namespace loom::coordinator {

class TokenStreams {
 public:
  // `end` must be safe to call until Remove(handle) has returned.
  int64_t Add(const std::string& user, std::function<void()> end);
  void Remove(int64_t handle);
  // Ends every stream of the user; returns how many.
  int EndAll(const std::string& user);

 private:
  struct Stream {
    std::string user;
    std::function<void()> end;
  };
  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, Stream> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::coordinator
