#include "worker/comm/tcp_address.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom::comm {
namespace {

absl::Status CheckInterface(const std::string& interface) {
  struct ifaddrs* addrs = nullptr;
  if (getifaddrs(&addrs) != 0) {
    return absl::InternalError(absl::StrCat("cannot list network interfaces: ", std::strerror(errno)));
  }
  bool found = false;
  for (struct ifaddrs* a = addrs; a != nullptr && !found; a = a->ifa_next) {
    found = a->ifa_addr != nullptr && interface == a->ifa_name &&
            (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6);
  }
  freeifaddrs(addrs);
  if (!found) {
    return absl::InvalidArgumentError(
        absl::StrCat("network interface '", interface, "' does not exist or has no IP address"));
  }
  return absl::OkStatus();
}

absl::Status CheckHostname(const std::string& hostname) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* result = nullptr;
  const int rv = getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
  if (rv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hostname '", hostname, "' does not resolve: ", gai_strerror(rv)));
  }
  bool bound = false;
  for (struct addrinfo* a = result; a != nullptr && !bound; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    bound = bind(fd, a->ai_addr, a->ai_addrlen) == 0;  // port 0: any free port
    close(fd);
  }
  freeaddrinfo(result);
  if (!bound) {
    return absl::InvalidArgumentError(
        absl::StrCat("hostname '", hostname, "' resolves, but to no address this machine can bind"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTcpBindTarget(const std::string& hostname, const std::string& interface) {
  if (!interface.empty()) return CheckInterface(interface);
  return CheckHostname(hostname);
}

}  // namespace loom::comm
