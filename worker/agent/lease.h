// The agent's lease (docs/fault_tolerance.md, "Fencing"): how long the agent
// may assume the coordinator still counts this node as live. Registered sets
// its length (Registered.lease_ms, the coordinator's node timeout; 0: no
// lease); each HeartbeatAck{seq} extends it to the send time of heartbeat
// seq plus that length. The coordinator declares a node lost no earlier than
// its node timeout after it *read* a heartbeat, which is later than the agent
// *sent* it, so a lease that has run out here means the node may have been
// declared lost there: the agent then pauses its ranks and relays nothing of
// theirs (rank_manager.h, store_relay.h).
//
// Expiries are counted (the "generation"): a rank may relay only while the
// lease runs and the generation is the one it was launched or resumed in, so
// a lease that ran out fences every rank at once, wherever that is noticed
// first (a relay, a heartbeat's ack, the watcher), even when the lease is
// renewed before the watcher has paused them.
//
// Pure logic over a monotonic clock (the time is a parameter, for tests),
// thread-safe; LeaseWatcher runs the pause when it runs out.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace loom::agent {

class Lease {
 public:
  using Clock = std::chrono::steady_clock;
  using TimePoint = Clock::time_point;

  // Heartbeat send times kept for their acks; older ones are forgotten (an
  // ack for them then extends nothing).
  static constexpr size_t kMaxUnacked = 1024;

  struct State {
    bool expired = false;     // the lease is on and has run out
    uint64_t generation = 0;  // expiries so far
  };

  // A coordinator answered a registration that was sent at `sent`: the
  // lease is lease_ms long from now on (0: none) and runs from `sent`. It
  // replaces what an earlier coordinator granted (that one leads no more).
  void Registered(int64_t lease_ms, TimePoint sent, TimePoint now = Clock::now());
  // Heartbeat `seq` was sent (written) at `sent`.
  void HeartbeatSent(int64_t seq, TimePoint sent);
  // The coordinator read heartbeat `seq`: the lease runs to its send time
  // plus the lease (never shortened).
  void Acked(int64_t seq, TimePoint now = Clock::now());

  // Whether it has run out at `now`; the first look after it ran out counts
  // the expiry (the generation goes up once per expiry).
  State Observe(TimePoint now = Clock::now());
  uint64_t generation() const;
  int64_t lease_ms() const;
  // When it runs out (meaningless while lease_ms() is 0).
  TimePoint deadline() const;

  // Blocks until an expiry newer than *seen has been counted (returns true
  // and updates *seen) or Stop (false). For LeaseWatcher's thread.
  bool WaitForExpiry(uint64_t* seen);
  void Stop();

 private:
  State ObserveLocked(TimePoint now);
  void ExtendLocked(TimePoint until, TimePoint now);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t lease_ms_ = 0;
  TimePoint deadline_{};
  bool counted_ = false;  // the current expiry has been counted
  uint64_t generation_ = 0;
  std::map<int64_t, TimePoint> sent_;  // seq -> send time, not yet acked
  bool stopped_ = false;
};

// Runs on_expire (on its own thread) each time the lease runs out, until
// destroyed. on_expire pauses the ranks; it must not wait on the lease.
class LeaseWatcher {
 public:
  LeaseWatcher(Lease* lease, std::function<void()> on_expire);
  ~LeaseWatcher();  // stops the lease's waiting and joins
  LeaseWatcher(const LeaseWatcher&) = delete;
  LeaseWatcher& operator=(const LeaseWatcher&) = delete;

 private:
  Lease* const lease_;
  const std::function<void()> on_expire_;
  std::thread thread_;  // last: starts after the rest exists
};

}  // namespace loom::agent
