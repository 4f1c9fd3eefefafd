// One fake node agent of loom-loadgen's scheduling run (sched_run.h): its
// NodeService.Session as loom-worker carries it out (RegisterNode with its
// labels, a heartbeat a second with its running ranks, RankExited), for ranks
// that only take time: a launched rank runs its job's train.steps at the
// run's fake step time, then exits 0; KillRanks ends it at once (signal 15).
// No rendezvous, no progress: the coordinator lets a job whose ranks all
// exited 0 succeed from STARTING. What each device runs, and when it came
// free, goes to the run's ledger (sched_ledger.h) for the checks.
//
// Writes go one at a time (gRPC allows one in flight) from an outbox.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/node.grpc.pb.h"
#include "tools/loadgen/sched_ledger.h"

namespace loom::loadgen {

// What every node of the run shares; owned by the run.
struct SchedShared {
  absl::Duration step = absl::Milliseconds(100);  // a fake step
  SchedLedger* ledger = nullptr;
  std::atomic<bool> shutting_down{false};
  std::atomic<int32_t> next_pid{100000};
  std::atomic<int> registered{0};
  std::atomic<int64_t> sessions_ended{0};
  // train.steps by job id: every rank of a job carries the same spec, parsed once.
  std::mutex steps_mu;
  std::map<std::string, int64_t> steps;
};

class SchedNode final
    : public grpc::ClientBidiReactor<loom::v1::NodeMessage, loom::v1::CoordinatorMessage> {
 public:
  SchedNode(std::string id, int gpus, std::map<std::string, std::string> labels,
            std::shared_ptr<grpc::Channel> channel, SchedShared* shared);

  const std::string& id() const { return id_; }
  // Opens the session and sends RegisterNode.
  void Start();
  // The 1 Hz heartbeat with the running ranks.
  void Heartbeat();
  // Ends the ranks whose time is up (RankExited, exit 0).
  void EndDue(absl::Time now);
  // Shutdown: cancels the session.
  void Cancel();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  struct Rank {
    std::string job_id;
    int32_t attempt = 0;
    int32_t rank = 0;
    int32_t device = 0;
    int32_t pid = 0;
    absl::Time end;
  };
  void Send(loom::v1::NodeMessage message);
  void Launch(const loom::v1::RankAssignment& assignment);
  void Kill(const loom::v1::KillRanks& kill);
  // The rank's exit as the agent reports it; its device is free from now.
  loom::v1::NodeMessage ExitLocked(const Rank& rank, int exit_code, int signal, absl::Time now);
  int64_t StepsOf(const loom::v1::RankAssignment& assignment);

  const std::string id_;
  const int gpus_;
  const std::map<std::string, std::string> labels_;
  std::unique_ptr<loom::v1::NodeService::Stub> stub_;
  SchedShared* const shared_;
  grpc::ClientContext context_;
  loom::v1::CoordinatorMessage in_;

  std::mutex mu_;
  std::vector<Rank> ranks_;
  std::deque<loom::v1::NodeMessage> outbox_;
  loom::v1::NodeMessage writing_message_;
  bool writing_ = false;
  bool ended_ = false;
  int64_t seq_ = 0;
};

}  // namespace loom::loadgen
