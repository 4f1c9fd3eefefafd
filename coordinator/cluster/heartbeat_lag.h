// How late the coordinator reads heartbeats, so that its own backlog is not
// mistaken for silent nodes. Each session's heartbeats carry the agent's
// monotonic send time; a heartbeat's lag is how much later than the
// session's fastest one it was read (the fastest bounds the clock offset and
// the network's own delay). The backlog is the 90th percentile of the lags
// of the heartbeats read in the last window: when many nodes' heartbeats
// arrive late, the coordinator (or something they share) lags, not the
// nodes, and a node is declared lost only after the timeout plus that backlog
// (or plus its own last lag, if larger). The percentile leaves out the few
// slowest senders, so one node's trouble does not delay the verdict on
// every other. Pure logic with explicit times; NodeRegistry holds one under
// its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "absl/time/time.h"

namespace loom::coordinator {

// One session's clock baseline.
class SessionLag {
 public:
  // The lag of a heartbeat sent at sent_monotonic_us (agent clock) and read
  // at `read`; zero for the session's fastest so far, nullopt when the
  // heartbeat has no send time.
  std::optional<absl::Duration> Observe(int64_t sent_monotonic_us, absl::Time read);

 private:
  std::optional<int64_t> min_offset_us_;  // min over the session of read - sent
};

// The backlog over all sessions.
class HeartbeatLag {
 public:
  // Lags older than window no longer count; beyond max_credit the backlog is
  // not trusted (a coordinator a minute behind cannot judge liveness anyway).
  explicit HeartbeatLag(absl::Duration window = absl::Seconds(2),
                        absl::Duration max_credit = absl::Seconds(60));

  void Observe(absl::Duration lag, absl::Time read);
  // The 90th percentile of the lags of the heartbeats read within the window
  // before now, at most max_credit; zero when none was read.
  absl::Duration Backlog(absl::Time now);

 private:
  void Prune(absl::Time now);

  const absl::Duration window_;
  const absl::Duration max_credit_;
  std::deque<std::pair<absl::Time, absl::Duration>> samples_;  // oldest first
};

}  // namespace loom::coordinator
