// Bearer tokens for users without a client certificate. An admin creates one
// per user (`loomctl token create --user=NAME`); the coordinator keeps only
// the SHA-256 of each token, in a file of its state directory, so a leaked
// state directory leaks no credentials. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace loom::coordinator::auth {

class UserTokenStore {
 public:
  // Reads path if it exists (lines "<sha256 hex> <user>"); writes go there.
  static absl::StatusOr<std::unique_ptr<UserTokenStore>> Open(const std::string& path);

  // A new random token for user (a valid name); persisted before it returns.
  absl::StatusOr<std::string> Create(const std::string& user);
  // Every token of user stops working; returns how many there were.
  absl::StatusOr<int> Revoke(const std::string& user);
  // The user a token belongs to; UNAUTHENTICATED for an unknown token.
  absl::StatusOr<std::string> Lookup(const std::string& token) const;

  static bool LooksLikeUserToken(const std::string& token);

 private:
  explicit UserTokenStore(std::string path) : path_(std::move(path)) {}
  absl::Status SaveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> user_by_hash_ ABSL_GUARDED_BY(mu_);  // hex hash -> user
};

}  // namespace loom::coordinator::auth
