// Which node sessions may beat on the liveness path, and when each was last
// heard there (docs/fault_tolerance.md, "Lost nodes"). The node registry
// keeps it in step with itself: a node's current session counts its beats
// while the node is live and the session open, and nothing else does, so an
// acknowledged beat never extends an agent's lease past the moment this
// coordinator may declare its node lost, and an agent whose session was
// replaced keeps no lease by beating.
//
// Its lock is held for a lookup and an HMAC at most and is taken by nothing
// else while held (lock order: the registry's, then this one), so the thread
// that reads beats (liveness_listener.h) never waits behind the coordinator's
// other work. Pure logic over times given by the caller; thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/liveness/beat_datagram.h"

namespace loom::coordinator {

class LivenessBoard {
 public:
  // From now on node_id's beats under `grant` count (the node's current
  // session, live). A grant it already counted keeps its newest sequence
  // number, so beats captured earlier are never taken again.
  void Count(const std::string& node_id, const liveness::Grant& grant);
  // Nothing beats for node_id any more (its session ended, it was declared
  // lost) until Count.
  void Stop(const std::string& node_id);
  // When a beat of the node's counting session was last accepted
  // (InfinitePast: none since it began counting).
  absl::Time HeardAt(const std::string& node_id) const;
  // When the node's last beat was accepted, counting now or not
  // (InfinitePast: none of its current grant); for what a loss says.
  absl::Time LastBeat(const std::string& node_id) const;

  // One datagram from the network, read at `now`: the ack to send back when
  // it is an authentic beat of a counting session with a sequence number
  // newer than any accepted before; nullopt (and nothing changes) otherwise.
  std::optional<std::string> Accept(std::string_view bytes, absl::Time now);

  int64_t heard() const { return heard_.load(std::memory_order_relaxed); }
  int64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    liveness::Grant grant;
    bool counting = false;
    int64_t newest_seq = 0;
    absl::Time heard = absl::InfinitePast();
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> heard_{0};
  std::atomic<int64_t> refused_{0};
};

}  // namespace loom::coordinator
