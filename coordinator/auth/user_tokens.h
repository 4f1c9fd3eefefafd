// Bearer tokens for users without a client certificate. An admin creates one
// per user (`loomctl token create --user=NAME`); the coordinator keeps only
// the SHA-256 of each token, in a file of its state directory (or, with
// several coordinators on etcd, in an etcd key every leader reads), so a
// leaked state directory leaks no credentials. Thread-safe: a change is
// saved before it takes effect (copy on write), and lookups read the current
// set without ever waiting for a save.
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

// A file of the state directory (absent: ""), written whole with mode 0600,
// fsynced and renamed over the old one. Also the quota book's (jobs/quota_book.h).
TokenPersistence FilePersistence(const std::string& path);

class UserTokenStore {
 public:
  // Reads path if it exists; writes go there (whole, mode 0600, renamed).
  static absl::StatusOr<std::unique_ptr<UserTokenStore>> Open(const std::string& path);
  static absl::StatusOr<std::unique_ptr<UserTokenStore>> Open(TokenPersistence persistence);

  // A new random token for user (a valid name); persisted before it
  // returns. A failed save changes nothing and is UNAVAILABLE naming why.
  absl::StatusOr<std::string> Create(const std::string& user);
  // Every token of user stops working; returns how many there were. Saved
  // first, as Create.
  absl::StatusOr<int> Revoke(const std::string& user);
  // The user a token belongs to; UNAUTHENTICATED for an unknown token.
  absl::StatusOr<std::string> Lookup(const std::string& token) const;

  static bool LooksLikeUserToken(const std::string& token);

 private:
  using Hashes = std::map<std::string, std::string>;  // hex hash -> user

  explicit UserTokenStore(TokenPersistence persistence) : persistence_(std::move(persistence)) {}
  std::shared_ptr<const Hashes> Current() const;
  // Saves next and makes it current; nothing changes if the save fails.
  absl::Status Replace(Hashes next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  const TokenPersistence persistence_;
  absl::Mutex write_mu_;  // one change at a time, held across its save
  mutable absl::Mutex read_mu_;  // held only to read or swap the pointer
  std::shared_ptr<const Hashes> hashes_ ABSL_GUARDED_BY(read_mu_) =
      std::make_shared<const Hashes>();
};

}  // namespace loom::coordinator::auth
