#include "coordinator/auth/rank_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/crypto/crypto.h"

namespace loom::coordinator::auth {
namespace {

constexpr char kPrefix[] = "loomr1.";
constexpr size_t kKeyBytes = 32;

absl::Status Refused(const std::string& why) {
  return absl::UnauthenticatedError(absl::StrCat("rank token refused: ", why));
}

}  // namespace

absl::StatusOr<RankTokenCodec> RankTokenCodec::LoadOrCreate(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const std::string key = crypto::RandomBytes(kKeyBytes);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return absl::InternalError(absl::StrCat("cannot create the rank token key ", path));
    const bool written = ::write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size());
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    if (!written || !synced) {
      return absl::InternalError(absl::StrCat("cannot write the rank token key ", path));
    }
    return RankTokenCodec(key);
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (buffer.str().size() < kKeyBytes) {
    return absl::DataLossError(absl::StrCat("rank token key ", path, " is shorter than ",
                                            kKeyBytes, " bytes; delete it to make a new one"));
  }
  return RankTokenCodec(buffer.str());
}

std::string RankTokenCodec::Issue(const RankClaim& claim) const {
  const std::string payload = absl::StrJoin(
      {claim.job_id, absl::StrCat(claim.attempt), absl::StrCat(claim.rank), claim.node_id,
       claim.store_namespace},
      "\n");
  return absl::StrCat(kPrefix, crypto::ToHex(payload), ".",
                      crypto::ToHex(crypto::HmacSha256(key_, payload)));
}

absl::StatusOr<RankClaim> RankTokenCodec::Verify(const std::string& token) const {
  if (!LooksLikeRankToken(token)) return Refused("not a rank token");
  const std::string body = token.substr(sizeof(kPrefix) - 1);
  const size_t dot = body.find('.');
  std::string payload;
  std::string mac;
  if (dot == std::string::npos || !crypto::FromHex(body.substr(0, dot), &payload) ||
      !crypto::FromHex(body.substr(dot + 1), &mac)) {
    return Refused("malformed");
  }
  if (!crypto::ConstantTimeEqual(mac, crypto::HmacSha256(key_, payload))) {
    return Refused("bad signature");
  }
  const std::vector<std::string> fields = absl::StrSplit(payload, '\n');
  RankClaim claim;
  if (fields.size() != 5 || !absl::SimpleAtoi(fields[1], &claim.attempt) ||
      !absl::SimpleAtoi(fields[2], &claim.rank)) {
    return Refused("malformed claim");
  }
  claim.job_id = fields[0];
  claim.node_id = fields[3];
  claim.store_namespace = fields[4];
  return claim;
}

bool RankTokenCodec::LooksLikeRankToken(const std::string& token) {
  return token.rfind(kPrefix, 0) == 0;
}

}  // namespace loom::coordinator::auth
