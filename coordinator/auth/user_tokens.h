// Bearer tokens for users without a client certificate. An admin creates one
// per user (`loomctl token create --user=NAME`); the coordinator keeps only
// the SHA-256 of each token, in a file of its state directory (or, with
// several coordinators on etcd, in an etcd key every leader reads), so a
// leaked state directory leaks no credentials. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace loom::coordinator::auth {

// Where the hashes are kept: the whole list as text, lines "<sha256 hex>
// <user>"; load returns "" when nothing was saved yet; save is durable when it
// returns OK.
struct TokenPersistence {
  std::string name;  // in error messages: a path, an etcd key
  std::function<absl::StatusOr<std::string>()> load;
  std::function<absl::Status(const std::string& text)> save;
};

class UserTokenStore {
 public:
  // Reads path if it exists; writes go there (whole, mode 0600, renamed).
  static absl::StatusOr<std::unique_ptr<UserTokenStore>> Open(const std::string& path);
  static absl::StatusOr<std::unique_ptr<UserTokenStore>> Open(TokenPersistence persistence);

  // A new random token for user (a valid name); persisted before it returns.
  absl::StatusOr<std::string> Create(const std::string& user);
  // Every token of user stops working; returns how many there were.
  absl::StatusOr<int> Revoke(const std::string& user);
  // The user a token belongs to; UNAUTHENTICATED for an unknown token.
  absl::StatusOr<std::string> Lookup(const std::string& token) const;

  static bool LooksLikeUserToken(const std::string& token);

 private:
  explicit UserTokenStore(TokenPersistence persistence) : persistence_(std::move(persistence)) {}
  absl::Status SaveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TokenPersistence persistence_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> user_by_hash_ ABSL_GUARDED_BY(mu_);  // hex hash -> user
};

}  // namespace loom::coordinator::auth
