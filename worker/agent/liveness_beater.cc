#include "worker/agent/liveness_beater.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/liveness/thread_priority.h"
#include "common/liveness/udp_socket.h"

namespace loom::agent {

absl::StatusOr<std::unique_ptr<LivenessBeater>> LivenessBeater::Start(Options options) {
  absl::StatusOr<int> fd = liveness::ConnectUdp(options.host, options.port);
  if (!fd.ok()) return fd.status();
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(*fd);
    return absl::InternalError(absl::StrCat("liveness beats: pipe: ", std::strerror(errno)));
  }
  return std::unique_ptr<LivenessBeater>(
      new LivenessBeater(std::move(options), *fd, wake[0], wake[1]));
}

LivenessBeater::LivenessBeater(Options options, int fd, int wake_read, int wake_write)
    : options_(std::move(options)),
      fd_(fd),
      wake_read_(wake_read),
      wake_write_(wake_write),
      thread_([this] { Run(); }) {}

LivenessBeater::~LivenessBeater() {
  const char byte = 0;
  while (write(wake_write_, &byte, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  close(fd_);
  close(wake_read_);
  close(wake_write_);
}

void LivenessBeater::Run() {
  if (!liveness::RaiseThisThread()) {
    std::fprintf(stderr,
                 "loom-worker: liveness beats run at the agent's priority (nice %d needs "
                 "CAP_SYS_NICE): a saturated node may send them late\n",
                 liveness::kLivenessNice);
  }
  using Clock = std::chrono::steady_clock;
  const auto interval = absl::ToChronoNanoseconds(options_.interval);
  Clock::time_point next = Clock::now();
  while (true) {
    if (Clock::now() >= next) {
      Send();
      // From now, not from `next`: after a stall (the agent stopped) one
      // beat goes, not the backlog.
      next = Clock::now() + interval;
    }
    pollfd polled[2] = {{fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
    const int rc = poll(polled, 2, static_cast<int>(std::max<int64_t>(0, wait.count()) + 1));
    if (rc < 0 && errno != EINTR) return;
    if (polled[1].revents != 0) return;
    if (polled[0].revents != 0) ReadAcks();
  }
}

void LivenessBeater::Send() {
  liveness::Datagram beat;
  beat.kind = liveness::Kind::kBeat;
  beat.session = options_.grant.session;
  beat.seq = options_.seq->fetch_add(1) + 1;
  beat.node_id = options_.node_id;
  const std::string bytes = liveness::Seal(beat, options_.grant.key);
  // Noted before the send, so its ack always finds it.
  if (options_.lease != nullptr) options_.lease->HeartbeatSent(beat.seq, std::chrono::steady_clock::now());
  // Best effort: a beat lost (or refused while the coordinator is away) is
  // made up by the next, and the session's heartbeats go on regardless.
  if (send(fd_, bytes.data(), bytes.size(), MSG_DONTWAIT) == static_cast<ssize_t>(bytes.size())) {
    sent_.fetch_add(1);
  }
}

void LivenessBeater::ReadAcks() {
  char buffer[liveness::kMaxDatagramBytes + 1];
  while (true) {
    const ssize_t got = recv(fd_, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN, or the ICMP error of a beat nobody read
    }
    const std::string_view bytes(buffer, static_cast<size_t>(got));
    const std::optional<liveness::Datagram> ack = liveness::Peek(bytes);
    if (!ack.has_value() || ack->kind != liveness::Kind::kAck ||
        ack->session != options_.grant.session || ack->node_id != options_.node_id ||
        !liveness::Authentic(bytes, options_.grant.key)) {
      continue;
    }
    acked_.fetch_add(1);
    if (options_.lease != nullptr) options_.lease->Acked(ack->seq);
  }
}

}  // namespace loom::agent
