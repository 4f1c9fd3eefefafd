// The few cryptographic primitives auth needs (OpenSSL's libcrypto): secure
// random bytes, SHA-256, HMAC-SHA256, hex, constant-time comparison.
#pragma once

#include <string>
#include <string_view>

namespace loom::coordinator::auth {

std::string RandomBytes(size_t n);  // aborts if the system has no entropy
std::string Sha256(std::string_view data);
std::string HmacSha256(std::string_view key, std::string_view data);
std::string ToHex(std::string_view bytes);
bool FromHex(std::string_view hex, std::string* out);
bool ConstantTimeEqual(std::string_view a, std::string_view b);

}  // namespace loom::coordinator::auth
