// The liveness path end to end over real UDP sockets on loopback: the
// agent's LivenessBeater beats, the coordinator's LivenessListener reads on
// its own thread and records on the board, its acks keep the agent's lease;
// once the board stops counting the session (its node lost, its session
// ended) the lease runs out. Bounded waits only; no timing is asserted
// beyond "within the lease, many times over".
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "common/liveness/udp_socket.h"
#include "coordinator/cluster/liveness_board.h"
#include "coordinator/service/liveness_listener.h"
#include "gtest/gtest.h"
#include "worker/agent/lease.h"
#include "worker/agent/liveness_beater.h"

namespace loom {
namespace {

using agent::Lease;
using agent::LivenessBeater;
using coordinator::LivenessBoard;
using coordinator::LivenessListener;
using Clock = std::chrono::steady_clock;

bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds within) {
  const Clock::time_point until = Clock::now() + within;
  while (Clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

struct Path {
  LivenessBoard board;
  std::unique_ptr<LivenessListener> listener;
  liveness::Grant grant = liveness::NewGrant();
  Lease lease;
  std::atomic<int64_t> seq{0};

  Path() {
    absl::StatusOr<std::unique_ptr<LivenessListener>> started =
        LivenessListener::Start("127.0.0.1", 0, &board);
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) listener = *std::move(started);
  }

  std::unique_ptr<LivenessBeater> Beater(int port, absl::Duration interval) {
    absl::StatusOr<std::unique_ptr<LivenessBeater>> beater = LivenessBeater::Start(
        {.host = "127.0.0.1", .port = port, .node_id = "node-a", .grant = grant,
         .interval = interval, .lease = &lease, .seq = &seq});
    EXPECT_TRUE(beater.ok()) << beater.status();
    return beater.ok() ? *std::move(beater) : nullptr;
  }
};

TEST(LivenessPathTest, AckedBeatsAloneKeepTheLease) {
  Path path;
  ASSERT_NE(path.listener, nullptr);
  ASSERT_GT(path.listener->port(), 0);
  path.board.Count("node-a", path.grant);
  // A 3 s lease from now; nothing but beats (every 50 ms) extends it, for
  // 7 s: without them it would have run out before half that time.
  path.lease.Registered(3000, Clock::now());
  auto beater = path.Beater(path.listener->port(), absl::Milliseconds(50));
  ASSERT_NE(beater, nullptr);
  const Clock::time_point until = Clock::now() + std::chrono::seconds(7);
  while (Clock::now() < until) {
    EXPECT_FALSE(path.lease.Observe().expired);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Read in this order while beats still fly: each beat is heard before it
  // is acked and sent before it is heard.
  const int64_t acked = beater->acked();
  const int64_t heard = path.board.heard();
  const int64_t sent = beater->sent();
  EXPECT_GT(acked, 20);
  EXPECT_LE(acked, heard);
  EXPECT_LE(heard, sent);
  EXPECT_GE(path.seq.load(), sent);
  EXPECT_GT(path.board.HeardAt("node-a"), absl::Now() - absl::Seconds(3));
}

TEST(LivenessPathTest, ALeaseRunsOutOnceTheSessionNoLongerCounts) {
  Path path;
  ASSERT_NE(path.listener, nullptr);
  path.board.Count("node-a", path.grant);
  path.lease.Registered(300, Clock::now());
  auto beater = path.Beater(path.listener->port(), absl::Milliseconds(50));
  ASSERT_NE(beater, nullptr);
  ASSERT_TRUE(WaitFor([&] { return beater->acked() >= 3; }, std::chrono::seconds(20)));
  // Declared lost (or its session ended): the beats go on, nothing hears
  // or acks them any more.
  path.board.Stop("node-a");
  const int64_t heard = path.board.heard();
  EXPECT_TRUE(WaitFor([&] { return path.lease.Observe().expired; }, std::chrono::seconds(10)));
  EXPECT_TRUE(WaitFor([&] { return path.board.refused() > 0; }, std::chrono::seconds(10)));
  EXPECT_EQ(path.board.heard(), heard);
  EXPECT_TRUE(path.lease.Observe().expired);
}

TEST(LivenessPathTest, BeatsOfAnotherGrantAreNotAcked) {
  Path path;
  ASSERT_NE(path.listener, nullptr);
  path.board.Count("node-a", liveness::NewGrant());  // the node's real session
  path.lease.Registered(300, Clock::now());
  auto beater = path.Beater(path.listener->port(), absl::Milliseconds(50));
  ASSERT_NE(beater, nullptr);
  ASSERT_TRUE(WaitFor([&] { return path.board.refused() >= 5; }, std::chrono::seconds(20)));
  EXPECT_EQ(beater->acked(), 0);
  EXPECT_EQ(path.board.HeardAt("node-a"), absl::InfinitePast());
  EXPECT_TRUE(WaitFor([&] { return path.lease.Observe().expired; }, std::chrono::seconds(5)));
}

TEST(LivenessPathTest, NoListenerMeansNoAckAndNoHarm) {
  // A port nobody reads (bound and closed again): the beats are refused by
  // the kernel; the beater goes on and stops cleanly.
  int port = 0;
  {
    LivenessBoard board;
    absl::StatusOr<std::unique_ptr<LivenessListener>> gone =
        LivenessListener::Start("127.0.0.1", 0, &board);
    ASSERT_TRUE(gone.ok());
    port = (*gone)->port();
  }
  Path path;
  path.lease.Registered(200, Clock::now());
  auto beater = path.Beater(port, absl::Milliseconds(20));
  ASSERT_NE(beater, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(beater->acked(), 0);
  EXPECT_TRUE(path.lease.Observe().expired);
}

TEST(LivenessPathTest, AnAddressThatIsNotHostPortIsNamed) {
  absl::StatusOr<std::string> host = liveness::HostOf("dns:///coord.example:7070");
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(*host, "coord.example");
  EXPECT_EQ(*liveness::HostOf("[::1]:7070"), "::1");
  EXPECT_EQ(*liveness::HostOf("ipv4:10.0.0.1:7070"), "10.0.0.1");
  absl::StatusOr<std::string> bad = liveness::HostOf("coordinator");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("coordinator"), std::string::npos);
}

}  // namespace
}  // namespace loom
