#include "common/liveness/udp_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom::liveness {
namespace {

struct AddressList {
  addrinfo* head = nullptr;
  ~AddressList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

absl::Status Resolve(const std::string& host, int port, bool passive, AddressList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints,
                             &out->head);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  return absl::OkStatus();
}

int NewSocket(const addrinfo& address) {
  return socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                address.ai_protocol);
}

}  // namespace

absl::StatusOr<std::string> HostOf(const std::string& target) {
  std::string rest = target;
  for (const char* scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(rest, scheme)) {
      rest = rest.substr(std::strlen(scheme));
      break;
    }
  }
  std::string host;
  std::string port;
  if (absl::StartsWith(rest, "[")) {
    const size_t close = rest.find(']');
    if (close != std::string::npos && close + 1 < rest.size() && rest[close + 1] == ':') {
      host = rest.substr(1, close - 1);
      port = rest.substr(close + 2);
    }
  } else if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  int number = 0;
  if (host.empty() || !absl::SimpleAtoi(port, &number)) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator address ", target, " is not HOST:PORT"));
  }
  return host;
}

absl::StatusOr<std::vector<int>> BindUdp(const std::string& host, int port) {
  AddressList addresses;
  if (absl::Status s = Resolve(host, port, true, &addresses); !s.ok()) return s;
  std::vector<int> sockets;
  std::string failures;
  for (addrinfo* a = addresses.head; a != nullptr; a = a->ai_next) {
    const int fd = NewSocket(*a);
    if (fd < 0) continue;
    if (a->ai_family == AF_INET6) {
      const int only = 1;  // "::" must not also claim the IPv4 port bound beside it
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only, sizeof(only));
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      absl::StrAppend(&failures, failures.empty() ? "" : "; ", std::strerror(errno));
      close(fd);
      continue;
    }
    sockets.push_back(fd);
  }
  if (sockets.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot bind UDP ", host, ":", port, ": ",
                                               failures.empty() ? "no address" : failures));
  }
  return sockets;
}

absl::StatusOr<int> ConnectUdp(const std::string& host, int port) {
  AddressList addresses;
  if (absl::Status s = Resolve(host, port, false, &addresses); !s.ok()) return s;
  for (addrinfo* a = addresses.head; a != nullptr; a = a->ai_next) {
    const int fd = NewSocket(*a);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
    close(fd);
  }
  return absl::UnavailableError(absl::StrCat("cannot reach UDP ", host, ":", port));
}

}  // namespace loom::liveness
