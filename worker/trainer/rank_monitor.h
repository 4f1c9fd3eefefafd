// The rank's health reporting and watchdog. Once a second it reports where the
// rank is (phase, and each group's collective sequence numbers and the
// collective in flight) so the coordinator can tell a hang from a slow step
// and name the rank that holds the others up. If a collective outlives the
// collective timeout by a grace period, the watchdog aborts the rank's
// communicators from this thread and ends the process with
// kExitCollectiveTimeout instead of letting it wait forever.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/trainer/progress_sink.h"

namespace loom::trainer {

// The loop's own phase, set by the training code (cheap: a mutex and a copy).
class PhaseBoard {
 public:
  void Set(const std::string& phase, int micro_batch = -1, int chunk = 0);
  void SetStep(int64_t step);
  struct Snapshot {
    std::string phase;
    int micro_batch = -1;
    int chunk = 0;
    int64_t step = 0;
    absl::Time since;
  };
  Snapshot Get() const;

 private:
  mutable absl::Mutex mu_;
  Snapshot current_ ABSL_GUARDED_BY(mu_) = {"starting", -1, 0, 0, absl::Now()};
};

struct RankMonitorOptions {
  absl::Duration report_interval = absl::Seconds(1);
  absl::Duration collective_timeout = absl::Seconds(60);
  // How long past the collective timeout the watchdog waits for the
  // communicator's own timeout before it aborts.
  absl::Duration watchdog_grace = absl::Seconds(10);
};

class RankMonitor {
 public:
  RankMonitor(RankMonitorOptions options, ProgressSink* reporter, const PhaseBoard* board,
              std::vector<comm::Communicator*> groups);
  ~RankMonitor();

 private:
  void Run();

  const RankMonitorOptions options_;
  ProgressSink* reporter_;
  const PhaseBoard* board_;
  std::vector<comm::Communicator*> groups_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace loom::trainer
