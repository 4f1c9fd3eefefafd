// Notices when this process could not run at all: stopped (SIGSTOP, a
// debugger), frozen or throttled by its cgroup, its machine's vCPU taken by
// the host. A thread wakes every `tick`; a wake-up later than `tick` by more
// than `min_stall` is a stall, reported as the span it could not run.
//
// Why the straggler detector needs it (docs/observability.md): a rank's own
// work is the time between its step reports less the time blocked in
// collectives, so a rank stopped while it waited in a collective looked like
// its peers: everyone waited, for it, and it showed nothing. With the stalls
// the time a stopped rank held a collective up counts as its own.
//
// Scheduling delays of a busy machine are mostly shorter than `min_stall`;
// longer ones fall on every rank alike and the detector compares peers.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/time/time.h"

namespace loom::comm {

class StallWatch {
 public:
  using OnStall = std::function<void(absl::Time from, absl::Time to)>;
  // on_stall runs on the watch's thread.
  explicit StallWatch(OnStall on_stall, absl::Duration tick = absl::Milliseconds(25),
                      absl::Duration min_stall = absl::Milliseconds(50));
  ~StallWatch();  // stops and joins at once
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

 private:
  void Run();

  const OnStall on_stall_;
  const absl::Duration tick_;
  const absl::Duration min_stall_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace loom::comm
