// The agent's lease (lease.h) as pure logic on a made-up clock: no lease
// until Registered names one; Registered runs it from the registration's send
// time; an ack extends it from its heartbeat's send time, never shortens it,
// and an ack of an unknown heartbeat extends nothing; each running-out is
// counted once, also when an ack renews the lease before anyone looked; a new
// registration replaces the lease. And the watcher runs its callback once per
// running-out.
#include "worker/agent/lease.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace loom::agent {
namespace {

using std::chrono::milliseconds;
using TimePoint = Lease::TimePoint;

// A fixed origin: the lease only compares times.
const TimePoint kT0 = TimePoint() + std::chrono::hours(1);

TimePoint At(int64_t ms) { return kT0 + milliseconds(ms); }

TEST(LeaseTest, NoLeaseNeverRunsOut) {
  Lease lease;
  EXPECT_FALSE(lease.Observe(At(1'000'000)).expired);
  lease.Registered(/*lease_ms=*/0, At(0), At(1));
  lease.HeartbeatSent(1, At(10));
  lease.Acked(1, At(20));
  EXPECT_FALSE(lease.Observe(At(1'000'000)).expired);
  EXPECT_EQ(lease.generation(), 0u);
}

TEST(LeaseTest, RunsFromTheRegistrationAndEachAckedHeartbeatsSendTime) {
  Lease lease;
  lease.Registered(1000, /*sent=*/At(0), /*now=*/At(300));
  EXPECT_FALSE(lease.Observe(At(999)).expired);
  EXPECT_TRUE(lease.Observe(At(1000)).expired);
  EXPECT_EQ(lease.generation(), 1u);

  Lease renewed;
  renewed.Registered(1000, At(0), At(300));
  renewed.HeartbeatSent(1, At(500));
  renewed.HeartbeatSent(2, At(600));
  renewed.Acked(2, At(900));  // read late: the lease still runs from when it was sent
  EXPECT_EQ(renewed.deadline(), At(1600));
  EXPECT_FALSE(renewed.Observe(At(1599)).expired);
  // An ack of an earlier heartbeat never shortens it (and 1 was forgotten
  // with 2's ack anyway).
  renewed.Acked(1, At(1000));
  EXPECT_EQ(renewed.deadline(), At(1600));
  // An ack of a heartbeat never sent extends nothing.
  renewed.Acked(99, At(1500));
  EXPECT_EQ(renewed.deadline(), At(1600));
  EXPECT_TRUE(renewed.Observe(At(1600)).expired);
}

TEST(LeaseTest, ARunOutIsCountedOnceAndSticksWhenAnAckRenewsTheLeaseBeforeAnyoneLooked) {
  Lease lease;
  lease.Registered(1000, At(0), At(0));
  lease.HeartbeatSent(1, At(100));
  // Nobody looks while the lease runs out (a frozen agent); then the ack of
  // a heartbeat sent before the freeze arrives: it is too old to renew, and
  // the running-out is counted.
  lease.Acked(1, At(5000));
  Lease::State state = lease.Observe(At(5001));
  EXPECT_TRUE(state.expired);
  EXPECT_EQ(state.generation, 1u);
  // A heartbeat sent now is acked: the lease runs again, but the expiry that
  // was counted stays counted (the ranks of generation 0 stay fenced).
  lease.HeartbeatSent(2, At(5002));
  lease.Acked(2, At(5003));
  state = lease.Observe(At(5004));
  EXPECT_FALSE(state.expired);
  EXPECT_EQ(state.generation, 1u);
  // Looking again does not count it again; the next running-out does.
  EXPECT_EQ(lease.Observe(At(5005)).generation, 1u);
  EXPECT_EQ(lease.Observe(At(6002)).generation, 2u);
  EXPECT_EQ(lease.Observe(At(7000)).generation, 2u);
}

TEST(LeaseTest, AnAckThatRenewsAnUnobservedRunOutStillCountsIt) {
  Lease lease;
  lease.Registered(1000, At(0), At(0));
  lease.HeartbeatSent(1, At(100));
  lease.HeartbeatSent(2, At(1500));
  // The lease ran out at 1000; nobody looked; the ack of heartbeat 2 renews it.
  lease.Acked(2, At(1600));
  const Lease::State state = lease.Observe(At(1601));
  EXPECT_FALSE(state.expired);
  EXPECT_EQ(state.generation, 1u);
}

TEST(LeaseTest, ANewRegistrationReplacesTheLease) {
  Lease lease;
  lease.Registered(10'000, At(0), At(0));
  lease.HeartbeatSent(1, At(100));
  // Another coordinator leads now, with a shorter node timeout: its lease
  // counts, from this registration; the old session's heartbeats are
  // forgotten.
  lease.Registered(2000, At(500), At(600));
  EXPECT_EQ(lease.deadline(), At(2500));
  lease.Acked(1, At(700));
  EXPECT_EQ(lease.deadline(), At(2500));
  EXPECT_EQ(lease.lease_ms(), 2000);
  // One with no lease turns it off.
  lease.Registered(0, At(800), At(900));
  EXPECT_FALSE(lease.Observe(At(1'000'000)).expired);
  EXPECT_EQ(lease.generation(), 0u);
}

TEST(LeaseWatcherTest, RunsItsCallbackOncePerRunOut) {
  Lease lease;
  std::atomic<int> calls{0};
  absl::Notification first;
  {
    LeaseWatcher watcher(&lease, [&] {
      if (calls.fetch_add(1) == 0) first.Notify();
    });
    // A lease that has run out already (registered long ago, by the clock).
    lease.Registered(1000, Lease::Clock::now() - milliseconds(5000));
    ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(30)));
    // Renewed, with no run-out since: no further call.
    lease.Registered(60'000, Lease::Clock::now());
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace loom::agent
