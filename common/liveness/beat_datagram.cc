#include "common/liveness/beat_datagram.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>

namespace loom::liveness {
namespace {

constexpr std::string_view kMagic = "LMB1";
constexpr size_t kMacBytes = 32;
constexpr size_t kHeaderBytes = 4 + 1 + 8 + 8 + 1;

void PutU64(std::string& out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

uint64_t GetU64(std::string_view in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  return v;
}

std::string Mac(std::string_view body, std::string_view key) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(body.data()), body.size(), mac, &length);
  return std::string(reinterpret_cast<const char*>(mac), length);
}

}  // namespace

Grant NewGrant() {
  unsigned char bytes[8 + kKeyBytes];
  // Without entropy no key is safe to hand out: a coordinator cannot run.
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) std::abort();
  Grant grant;
  for (int i = 0; i < 8; ++i) grant.session = (grant.session << 8) | bytes[i];
  grant.key.assign(reinterpret_cast<const char*>(bytes + 8), kKeyBytes);
  return grant;
}

std::string Seal(const Datagram& datagram, std::string_view key) {
  if (datagram.node_id.size() > 255) return "";
  std::string out(kMagic);
  out.push_back(static_cast<char>(datagram.kind));
  PutU64(out, datagram.session);
  PutU64(out, static_cast<uint64_t>(datagram.seq));
  out.push_back(static_cast<char>(datagram.node_id.size()));
  out += datagram.node_id;
  out += Mac(out, key);
  return out;
}

std::optional<Datagram> Peek(std::string_view bytes) {
  if (bytes.size() < kHeaderBytes + kMacBytes || bytes.size() > kMaxDatagramBytes) {
    return std::nullopt;
  }
  if (bytes.substr(0, 4) != kMagic) return std::nullopt;
  const uint8_t kind = static_cast<uint8_t>(bytes[4]);
  if (kind != static_cast<uint8_t>(Kind::kBeat) && kind != static_cast<uint8_t>(Kind::kAck)) {
    return std::nullopt;
  }
  const size_t id_length = static_cast<uint8_t>(bytes[kHeaderBytes - 1]);
  if (bytes.size() != kHeaderBytes + id_length + kMacBytes) return std::nullopt;
  Datagram datagram;
  datagram.kind = static_cast<Kind>(kind);
  datagram.session = GetU64(bytes.substr(5, 8));
  datagram.seq = static_cast<int64_t>(GetU64(bytes.substr(13, 8)));
  datagram.node_id = std::string(bytes.substr(kHeaderBytes, id_length));
  return datagram;
}

bool Authentic(std::string_view bytes, std::string_view key) {
  if (bytes.size() < kMacBytes || key.empty()) return false;
  const std::string_view body = bytes.substr(0, bytes.size() - kMacBytes);
  const std::string expected = Mac(body, key);
  return expected.size() == kMacBytes &&
         CRYPTO_memcmp(expected.data(), bytes.data() + body.size(), kMacBytes) == 0;
}

}  // namespace loom::liveness
