#include "coordinator/service/liveness_listener.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/liveness/thread_priority.h"
#include "common/liveness/udp_socket.h"

namespace loom::coordinator {
namespace {

constexpr int kDatagramsPerWake = 256;

int PortOf(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return 0;
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LivenessListener>> LivenessListener::Start(const std::string& host,
                                                                         int port,
                                                                         LivenessBoard* board) {
  absl::StatusOr<std::vector<int>> sockets = liveness::BindUdp(host, port);
  if (!sockets.ok()) return sockets.status();
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    for (int fd : *sockets) close(fd);
    return absl::InternalError(absl::StrCat("liveness listener: pipe: ", std::strerror(errno)));
  }
  return std::unique_ptr<LivenessListener>(
      new LivenessListener(*std::move(sockets), wake[0], wake[1], board));
}

LivenessListener::LivenessListener(std::vector<int> sockets, int wake_read, int wake_write,
                                   LivenessBoard* board)
    : sockets_(std::move(sockets)),
      wake_read_(wake_read),
      wake_write_(wake_write),
      board_(board),
      port_(PortOf(sockets_.front())),
      thread_([this] { Run(); }) {}

LivenessListener::~LivenessListener() {
  const char byte = 0;
  while (write(wake_write_, &byte, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  for (int fd : sockets_) close(fd);
  close(wake_read_);
  close(wake_write_);
}

void LivenessListener::Run() {
  if (!liveness::RaiseThisThread()) {
    std::fprintf(stderr,
                 "loom-coordinator: the liveness listener runs at the process's priority (nice %d "
                 "needs CAP_SYS_NICE): a saturated coordinator may read beats late\n",
                 liveness::kLivenessNice);
  }
  std::vector<pollfd> polled;
  for (int fd : sockets_) polled.push_back({fd, POLLIN, 0});
  polled.push_back({wake_read_, POLLIN, 0});
  while (true) {
    if (poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "loom-coordinator: liveness listener stopped: poll: %s\n",
                   std::strerror(errno));
      return;
    }
    if (polled.back().revents != 0) return;
    for (size_t i = 0; i + 1 < polled.size(); ++i) {
      if (polled[i].revents != 0) Drain(polled[i].fd);
    }
  }
}

void LivenessListener::Drain(int fd) {
  char buffer[liveness::kMaxDatagramBytes + 1];
  for (int n = 0; n < kDatagramsPerWake; ++n) {
    sockaddr_storage from{};
    socklen_t from_length = sizeof(from);
    const ssize_t got = recvfrom(fd, buffer, sizeof(buffer), 0,
                                 reinterpret_cast<sockaddr*>(&from), &from_length);
    if (got < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: all read; an ICMP error from an earlier answer: nothing to do
    }
    std::optional<std::string> ack =
        board_->Accept(std::string_view(buffer, static_cast<size_t>(got)), absl::Now());
    if (ack.has_value()) {
      // Best effort, as the beat was: a lost ack is made up by the next one.
      (void)sendto(fd, ack->data(), ack->size(), MSG_DONTWAIT,
                   reinterpret_cast<sockaddr*>(&from), from_length);
    }
  }
}

}  // namespace loom::coordinator
