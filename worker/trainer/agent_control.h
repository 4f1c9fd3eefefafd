// The rank's end of AgentService.Control (docs/fault_tolerance.md, "In-place
// recovery"): one server stream from its agent, opened at start with the
// rank's token and kept across attempts, whose AbortRanks and EnterEpoch go
// to the rank's ControlMailbox. Read on its own thread; re-opened with the
// newest token when the agent restarts. An agent without the call
// (UNIMPLEMENTED) leaves the rank without one: it then still leaves a failed
// attempt on its own when a collective fails.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/node.grpc.pb.h"
#include "worker/trainer/control_mailbox.h"

namespace loom::trainer {

class AgentControlStream {
 public:
  // agent: "unix:PATH" (loom-trainer --agent_socket).
  AgentControlStream(const std::string& agent, std::string rank_token, ControlMailbox* mailbox,
                     std::function<void(const std::string&)> on_event);
  ~AgentControlStream();  // cancels the stream and joins

  // The token to open the stream with from now on (a new attempt's).
  void set_rank_token(std::string token);

 private:
  void Run();

  std::unique_ptr<loom::v1::AgentService::Stub> stub_;
  ControlMailbox* mailbox_;
  std::function<void(const std::string&)> on_event_;
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace loom::trainer
