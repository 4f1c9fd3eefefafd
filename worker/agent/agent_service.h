// AgentService: the node agent's local endpoint for its ranks, on a Unix
// socket in the work dir (callback API, thin). Every call carries
// `authorization: Bearer <rank token>`, accepted only for the current token
// of a rank this agent launched and still runs (an EnterEpoch replaces it).
//  - ReportProgress: every report must name that rank's job, attempt and
//    rank, and the token must still be current when it comes (after an
//    EnterEpoch the old stream's next report ends it), else the stream ends
//    with PERMISSION_DENIED and nothing of the refused report is forwarded.
//    Accepted reports go to the node session, which forwards them in batches
//    (node_session.h).
//  - StoreSet/Get/Add: checked the same way (the token, then the namespace:
//    only the rank's own current attempt's) and relayed to the coordinator by
//    the StoreRelay (store_relay.h).
//  - Control: the rank's control stream (rank_control.h), bound to the rank,
//    not the token, so it lasts across its attempts.
// While a rank is paused (the agent's lease ran out, lease.h) its progress
// and store calls are refused with UNAVAILABLE, which the trainer retries:
// nothing of it reaches the coordinator until it is resumed.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/node.grpc.pb.h"
#include "worker/agent/rank_control.h"
#include "worker/agent/rank_tokens.h"
#include "worker/agent/store_relay.h"

namespace loom::agent {

class AgentServiceImpl final : public loom::v1::AgentService::CallbackService {
 public:
  using Forward = std::function<void(loom::v1::RankProgress)>;
  // tokens, forward, store and control outlive the service; store and
  // control may be null (those calls are then UNIMPLEMENTED).
  AgentServiceImpl(const RankTokens* tokens, Forward forward, StoreRelay* store = nullptr,
                   RankControlHub* control = nullptr)
      : tokens_(tokens), forward_(std::move(forward)), store_(store), control_(control) {}

  grpc::ServerReadReactor<loom::v1::RankProgress>* ReportProgress(
      grpc::CallbackServerContext* context, loom::v1::ReportProgressResponse* response) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context,
                                     const loom::v1::StoreSetRequest* request,
                                     loom::v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context,
                                     const loom::v1::StoreGetRequest* request,
                                     loom::v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* context,
                                     const loom::v1::StoreAddRequest* request,
                                     loom::v1::StoreAddResponse* response) override;
  grpc::ServerWriteReactor<loom::v1::RankControl>* Control(
      grpc::CallbackServerContext* context, const loom::v1::ControlRequest* request) override;

 private:
  const RankTokens* tokens_;
  Forward forward_;
  StoreRelay* store_;
  RankControlHub* control_;
};

// "unix:<work_dir>/agent.sock", or INVALID_ARGUMENT naming --work_dir when
// the path does not fit a Unix socket address (sun_path).
absl::StatusOr<std::string> AgentSocketTarget(const std::string& work_dir);

// Serves `service` on the Unix socket of target ("unix:PATH") with local
// (UDS) credentials. A stale socket file at PATH is removed first (only a
// socket: anything else there is an error). The socket's mode is 0600, or
// 0666 when ranks run as another user (world_writable): the rank token is
// what authenticates a caller.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartAgentServer(const std::string& target,
                                                               bool world_writable,
                                                               grpc::Service* service);

}  // namespace loom::agent
