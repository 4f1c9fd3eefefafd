// Streams a rank's progress to its node agent (AgentService on the agent's
// Unix socket, with the rank's token as its bearer credential) on one
// long-lived ReportProgress stream, from a background thread so the training
// loop never waits. The agent forwards the node's reports to the coordinator
// in batches on its session (and follows the leader). The stream is re-opened
// when the agent restarts; reports queued meanwhile, and those written
// recently on the broken stream, are delivered in order.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/node.grpc.pb.h"
#include "worker/trainer/progress_sink.h"

namespace loom::trainer {

class ProgressReporter final : public ProgressSink {
 public:
  // agent: the agent's socket ("unix:PATH", loom-trainer --agent_socket).
  ProgressReporter(const std::string& agent, std::string rank_token, std::string job_id,
                   int32_t attempt, int32_t rank);
  ~ProgressReporter() override;  // flushes (bounded) and closes the stream

  // Fills job, attempt, rank and time; queues the report.
  void Report(loom::v1::RankProgress progress) override;
  // Waits up to timeout for the queue to drain.
  bool Flush(absl::Duration timeout) override;
  void Abandon() override;

 private:
  void Run();

  std::shared_ptr<grpc::Channel> channel_;
  const std::string authorization_;  // "Bearer <rank token>" (secret)
  const std::string job_id_;
  const int32_t attempt_;
  const int32_t rank_;

  absl::Mutex mu_;
  std::deque<loom::v1::RankProgress> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace loom::trainer
