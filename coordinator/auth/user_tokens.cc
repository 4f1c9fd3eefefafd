#include "coordinator/auth/user_tokens.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "coordinator/auth/crypto.h"
#include "coordinator/auth/identity.h"

namespace loom::coordinator::auth {
namespace {

constexpr char kPrefix[] = "loomu1.";

std::string HashOf(const std::string& token) { return ToHex(Sha256(token)); }

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::string();  // no tokens issued yet
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  // Written whole with mode 0600, then renamed over the old file.
  const std::string temp = path + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", temp));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<UserTokenStore>> UserTokenStore::Open(const std::string& path) {
  return Open(TokenPersistence{.name = path,
                               .load = [path] { return ReadFile(path); },
                               .save = [path](const std::string& text) {
                                 return WriteFile(path, text);
                               }});
}

absl::StatusOr<std::unique_ptr<UserTokenStore>> UserTokenStore::Open(
    TokenPersistence persistence) {
  absl::StatusOr<std::string> text = persistence.load();
  if (!text.ok()) return text.status();
  std::unique_ptr<UserTokenStore> store(new UserTokenStore(std::move(persistence)));
  std::istringstream in(*text);
  const std::string& path = store->persistence_.name;
  std::string line;
  int number = 0;
  absl::MutexLock lock(&store->mu_);
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string hash;
    std::string user;
    if (!(fields >> hash >> user) || hash.size() != 64 || !IsValidName(user)) {
      return absl::DataLossError(absl::StrCat(path, ":", number,
                                              ": expected '<sha256 hex> <user>'"));
    }
    store->user_by_hash_[hash] = user;
  }
  return store;
}

absl::StatusOr<std::string> UserTokenStore::Create(const std::string& user) {
  if (!IsValidName(user)) {
    return absl::InvalidArgumentError(
        absl::StrCat("user: '", user, "' must be 1 to 64 characters of [A-Za-z0-9._-]"));
  }
  const std::string token = absl::StrCat(kPrefix, ToHex(RandomBytes(32)));
  absl::MutexLock lock(&mu_);
  user_by_hash_[HashOf(token)] = user;
  if (absl::Status s = SaveLocked(); !s.ok()) {
    user_by_hash_.erase(HashOf(token));
    return s;
  }
  return token;
}

absl::StatusOr<int> UserTokenStore::Revoke(const std::string& user) {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::string> kept;
  int revoked = 0;
  for (const auto& [hash, owner] : user_by_hash_) {
    if (owner == user) {
      ++revoked;
    } else {
      kept[hash] = owner;
    }
  }
  std::swap(kept, user_by_hash_);
  if (absl::Status s = SaveLocked(); !s.ok()) {
    std::swap(kept, user_by_hash_);
    return s;
  }
  return revoked;
}

absl::StatusOr<std::string> UserTokenStore::Lookup(const std::string& token) const {
  if (!LooksLikeUserToken(token)) {
    return absl::UnauthenticatedError("bearer token refused: not a Loom user token");
  }
  absl::MutexLock lock(&mu_);
  auto it = user_by_hash_.find(HashOf(token));
  if (it == user_by_hash_.end()) {
    return absl::UnauthenticatedError("bearer token refused: unknown or revoked");
  }
  return it->second;
}

bool UserTokenStore::LooksLikeUserToken(const std::string& token) {
  return token.rfind(kPrefix, 0) == 0;
}

absl::Status UserTokenStore::SaveLocked() const {
  std::string text;
  for (const auto& [hash, user] : user_by_hash_) absl::StrAppend(&text, hash, " ", user, "\n");
  return persistence_.save(text);
}

}  // namespace loom::coordinator::auth
