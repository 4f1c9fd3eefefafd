// Streams a rank's progress to the coordinator on one long-lived
// ReportProgress stream, from a background thread so the training loop never
// waits on the network. The stream is re-opened after a coordinator restart
// (on the new leader, when there are several coordinators);
// step reports queued meanwhile are delivered in order.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/rpc/coordinator_channel.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/rank.grpc.pb.h"

namespace loom::trainer {

class ProgressReporter {
 public:
  ProgressReporter(std::shared_ptr<rpc::CoordinatorChannel> coordinators, std::string job_id,
                   int32_t attempt, int32_t rank);
  ~ProgressReporter();  // flushes (bounded) and closes the stream

  // Fills job, attempt, rank and time; queues the report.
  void Report(loom::v1::RankProgress progress);
  // Waits up to timeout for the queue to drain.
  bool Flush(absl::Duration timeout);

 private:
  void Run();

  std::shared_ptr<rpc::CoordinatorChannel> coordinators_;
  const std::string job_id_;
  const int32_t attempt_;
  const int32_t rank_;

  absl::Mutex mu_;
  std::deque<loom::v1::RankProgress> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace loom::trainer
