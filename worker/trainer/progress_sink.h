// Where a rank's progress reports go: its agent (ProgressReporter) in a real
// run, a recorder in a test of the epoch loop. One per attempt: the reports
// carry the attempt and are accepted with that attempt's token only.
#pragma once

#include "absl/time/time.h"
#include "loom/v1/rank.pb.h"

namespace loom::trainer {

class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  // Fills job, attempt, rank and time; never blocks on the receiver.
  virtual void Report(loom::v1::RankProgress progress) = 0;
  // Waits up to `timeout` for what was reported to be delivered.
  virtual bool Flush(absl::Duration timeout) = 0;
  // Drops what is still queued and stops trying to deliver it: the attempt
  // is over and its token may be refused already (a later attempt's
  // EnterEpoch came first), so the sink can go without waiting.
  virtual void Abandon() {}
};

}  // namespace loom::trainer
