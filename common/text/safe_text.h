// Text that came from outside (a name, an id, a value a request or a node
// sent) made fit for a log line or an error message: bytes that could forge
// a line or drive a terminal (newlines, escapes: every control
// character) are written as \xNN escapes, and text beyond a bound is cut, saying
// how long it was — so a 100 kB value cannot become a 100 kB error (which
// the client would receive as a transport error about metadata size instead
// of the rule it broke).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace loom {

inline constexpr size_t kSafeTextDefaultBytes = 128;

inline std::string SafeText(std::string_view text, size_t max_bytes = kSafeTextDefaultBytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  const bool cut = text.size() > max_bytes;
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 24);
  for (unsigned char c : cut ? text.substr(0, max_bytes) : text) {
    // Control characters are what forge lines and drive terminals; quotes,
    // backslashes and UTF-8 stay as they are (messages quote names).
    if (c >= 0x20 && c != 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  if (cut) absl::StrAppend(&out, "... (", text.size(), " bytes)");
  return out;
}

}  // namespace loom
