// The trainer's control channel as its epoch loop sees it (in-place recovery,
// docs/fault_tolerance.md): what the agent pushes on AgentService.Control
// (agent_control.h reads the stream and posts here; a test posts directly).
// An AbortRanks of attempt n aborts the communicators armed for attempt n at
// once, on the posting thread (a blocked collective returns ABORTED), or as
// soon as they are armed if it came first; an EnterEpoch waits for the loop
// to take it, and aborts its from_attempt too (an abort that never arrived
// is implied). Messages of other attempts are ignored. A StopRanks with a
// spill_step (an aborted attempt's end when the failed ranks have no room)
// waits for the loop like an EnterEpoch. Any other StopRanks (a graceful
// stop, of whichever attempt) is kept until the rank ends: the training loop
// asks StopRequested() at every step boundary. A TraceStep only notes the
// step to record (TraceWanted). Thread-safe.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/v1/node.pb.h"
#include "worker/comm/communicator_set.h"

namespace loom::trainer {

class ControlMailbox {
 public:
  void Post(const loom::v1::RankControl& message);

  // The communicators of `attempt`; an abort of it, posted before or after,
  // aborts them. Replaces what was armed.
  void Arm(int attempt, std::shared_ptr<comm::CommunicatorSet> set);
  // Releases them (before they are destroyed).
  void Disarm();
  // The reason of an abort of `attempt` posted so far, if any.
  std::optional<std::string> AbortOf(int attempt) const;

  // Why the rank was asked to stop gracefully (StopRanks posted, or SIGUSR1
  // caught: stop_signal.h); nullopt when it was not.
  std::optional<std::string> StopRequested() const;
  // Whether step `step` was asked to be recorded (TraceStep; the most
  // recent 16 requests are kept).
  bool TraceWanted(int64_t step) const;

  // What ends an aborted attempt for this rank: the EnterEpoch that moves it
  // on from `from_attempt`, or the StopRanks with a spill_step that tells it
  // to write its snapshots as a checkpoint and exit (no room was left for
  // the failed ranks). Exactly one is set.
  struct NextAttempt {
    std::optional<loom::v1::EnterEpoch> epoch;
    std::optional<loom::v1::StopRanks> spill;
  };
  // Returns as soon as either has been posted; DEADLINE_EXCEEDED naming the
  // wait when neither comes within `timeout`.
  absl::StatusOr<NextAttempt> WaitForNext(int from_attempt, absl::Duration timeout);

 private:
  void AbortLocked(int attempt, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<int, std::string> aborted_ ABSL_GUARDED_BY(mu_);  // attempt -> reason (recent ones)
  std::deque<loom::v1::EnterEpoch> epochs_ ABSL_GUARDED_BY(mu_);
  std::deque<loom::v1::StopRanks> spills_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> stop_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> trace_steps_ ABSL_GUARDED_BY(mu_);
  int armed_attempt_ ABSL_GUARDED_BY(mu_) = -1;
  std::shared_ptr<comm::CommunicatorSet> armed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::trainer
