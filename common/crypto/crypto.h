// The few cryptographic primitives Loom needs (OpenSSL's libcrypto): secure
// random bytes, SHA-256, HMAC-SHA256, hex, constant-time comparison. Used by
// the coordinator's auth (rank and user tokens) and by the liveness path's
// datagrams, on both the coordinator and the agent.
#pragma once

#include <string>
#include <string_view>

namespace loom::crypto {

std::string RandomBytes(size_t n);  // aborts if the system has no entropy
std::string Sha256(std::string_view data);
std::string HmacSha256(std::string_view key, std::string_view data);
std::string ToHex(std::string_view bytes);
bool FromHex(std::string_view hex, std::string* out);
bool ConstantTimeEqual(std::string_view a, std::string_view b);

}  // namespace loom::crypto
