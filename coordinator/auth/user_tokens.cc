#include "coordinator/auth/user_tokens.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/crypto/crypto.h"
#include "coordinator/auth/identity.h"

namespace loom::coordinator::auth {
namespace {

constexpr char kPrefix[] = "loomu1.";

std::string HashOf(const std::string& token) { return crypto::ToHex(crypto::Sha256(token)); }

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
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", temp, ": ", strerror(errno)));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  const int error = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", temp, ": ", strerror(error)));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

TokenPersistence FilePersistence(const std::string& path) {
  return TokenPersistence{.name = path,
                          .load = [path] { return ReadFile(path); },
                          .save = [path](const std::string& text) { return WriteFile(path, text); }};
}

absl::StatusOr<std::unique_ptr<UserTokenStore>> UserTokenStore::Open(const std::string& path) {
  return Open(FilePersistence(path));
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
  Hashes hashes;
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
    hashes[hash] = user;
  }
  absl::MutexLock lock(&store->read_mu_);
  store->hashes_ = std::make_shared<const Hashes>(std::move(hashes));
  return store;
}

std::shared_ptr<const UserTokenStore::Hashes> UserTokenStore::Current() const {
  absl::MutexLock lock(&read_mu_);
  return hashes_;
}

absl::Status UserTokenStore::Replace(Hashes next) {
  std::string text;
  for (const auto& [hash, user] : next) absl::StrAppend(&text, hash, " ", user, "\n");
  // Saved with only write_mu_ held: lookups go on meanwhile.
  if (absl::Status s = persistence_.save(text); !s.ok()) {
    absl::Status status = absl::UnavailableError(absl::StrCat(
        "the token list (", persistence_.name, ") could not be saved, nothing changed: ",
        s.message()));
    // A mark the writer set (a fenced write: this coordinator no longer leads) stays.
    s.ForEachPayload([&status](absl::string_view url, const absl::Cord& payload) {
      status.SetPayload(url, payload);
    });
    return status;
  }
  std::shared_ptr<const Hashes> current = std::make_shared<const Hashes>(std::move(next));
  {
    absl::MutexLock lock(&read_mu_);
    hashes_.swap(current);
  }
  return absl::OkStatus();  // the old set is freed here, outside the lock
}

absl::StatusOr<std::string> UserTokenStore::Create(const std::string& user) {
  if (!IsValidName(user)) {
    return absl::InvalidArgumentError(
        absl::StrCat("user: '", user, "' must be 1 to 64 characters of [A-Za-z0-9._-]"));
  }
  const std::string token = absl::StrCat(kPrefix, crypto::ToHex(crypto::RandomBytes(32)));
  absl::MutexLock lock(&write_mu_);
  Hashes next = *Current();
  next[HashOf(token)] = user;
  if (absl::Status s = Replace(std::move(next)); !s.ok()) return s;
  return token;
}

absl::StatusOr<int> UserTokenStore::Revoke(const std::string& user) {
  absl::MutexLock lock(&write_mu_);
  Hashes kept;
  int revoked = 0;
  for (const auto& [hash, owner] : *Current()) {
    if (owner == user) {
      ++revoked;
    } else {
      kept[hash] = owner;
    }
  }
  if (absl::Status s = Replace(std::move(kept)); !s.ok()) return s;
  return revoked;
}

absl::StatusOr<std::string> UserTokenStore::Lookup(const std::string& token) const {
  if (!LooksLikeUserToken(token)) {
    return absl::UnauthenticatedError("bearer token refused: not a Loom user token");
  }
  const std::shared_ptr<const Hashes> hashes = Current();
  auto it = hashes->find(HashOf(token));
  if (it == hashes->end()) {
    return absl::UnauthenticatedError("bearer token refused: unknown or revoked");
  }
  return it->second;
}

bool UserTokenStore::LooksLikeUserToken(const std::string& token) {
  return token.rfind(kPrefix, 0) == 0;
}


}  // namespace loom::coordinator::auth
