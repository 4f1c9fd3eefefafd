#include "coordinator/ha/etcd_target.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace loom::coordinator::ha {
namespace {

constexpr char kScheme[] = "etcd://";

absl::Status Invalid(const std::string& url, const std::string& rule) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--state=", url, ": ", rule, " (expected etcd://HOST:PORT[,HOST:PORT...]/PREFIX)"));
}

}  // namespace

absl::StatusOr<EtcdTarget> ParseEtcdTarget(const std::string& url) {
  if (!absl::StartsWith(url, kScheme)) return Invalid(url, "only etcd:// is supported");
  const std::string rest = url.substr(sizeof(kScheme) - 1);
  const size_t slash = rest.find('/');
  if (slash == std::string::npos) return Invalid(url, "a key prefix is required");
  EtcdTarget target;
  for (absl::string_view endpoint : absl::StrSplit(rest.substr(0, slash), ',')) {
    const size_t colon = endpoint.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return Invalid(url, absl::StrCat("endpoint '", endpoint, "' is not HOST:PORT"));
    }
    target.endpoints.emplace_back(endpoint);
  }
  std::string prefix = rest.substr(slash);
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  if (prefix.size() <= 1) return Invalid(url, "a key prefix is required");
  target.prefix = prefix;
  return target;
}

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

}  // namespace loom::coordinator::ha
