// The datagrams of the liveness path (docs/fault_tolerance.md, "Lost nodes"):
// an agent's beat and the coordinator's ack, each one UDP datagram with an
// HMAC-SHA256 over all of it, keyed by a secret the coordinator gave the
// agent's session in Registered (so only that session's agent can beat, and
// only that coordinator can ack). Nothing in them is secret; what matters is
// who sent them and that none is replayed (the receiver keeps the newest
// sequence number it accepted and takes only a newer one).
//
//   "LMB1" | kind (1: beat, 2: ack) | session (8) | seq (8) | id length (1) |
//   node id | HMAC-SHA256 over all of the above (32)
//
// Integers big-endian. Pure: no sockets here (liveness_listener.h and
// liveness_beater.h carry them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom::liveness {

inline constexpr size_t kKeyBytes = 32;
// Larger than any beat can be (a node id is at most 63 characters): a
// datagram this long is refused unread.
inline constexpr size_t kMaxDatagramBytes = 4 + 1 + 8 + 8 + 1 + 255 + 32;

enum class Kind : uint8_t { kBeat = 1, kAck = 2 };

// What a session may beat with: given at registration, over the session's
// (mutually authenticated) stream.
struct Grant {
  uint64_t session = 0;  // random: which registration of the node this is
  std::string key;       // kKeyBytes random bytes
};

struct Datagram {
  Kind kind = Kind::kBeat;
  uint64_t session = 0;
  int64_t seq = 0;
  std::string node_id;
};

// A fresh grant from the system's randomness.
Grant NewGrant();

// The datagram's bytes with their MAC under `key`. Empty when the node id is
// longer than 255 bytes (no such node registers).
std::string Seal(const Datagram& datagram, std::string_view key);

// The fields of a datagram whose structure is sound, MAC not yet checked:
// the receiver looks up the key by them. nullopt for anything malformed.
std::optional<Datagram> Peek(std::string_view bytes);

// Whether `bytes` carries a valid MAC under `key` (constant time).
bool Authentic(std::string_view bytes, std::string_view key);

}  // namespace loom::liveness
