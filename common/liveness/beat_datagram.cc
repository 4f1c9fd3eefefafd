#include "common/liveness/beat_datagram.h"

#include "common/crypto/crypto.h"

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

}  // namespace

Grant NewGrant() {
  Grant grant;
  grant.session = GetU64(crypto::RandomBytes(8));
  grant.key = crypto::RandomBytes(kKeyBytes);
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
  out += crypto::HmacSha256(key, out);
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
  return crypto::ConstantTimeEqual(crypto::HmacSha256(key, body), bytes.substr(body.size()));
}

}  // namespace loom::liveness
