#include "coordinator/service/liveness_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/auth/policy.h"
#include "coordinator/service/status_convert.h"

namespace loom::coordinator {

grpc::Status NodeLivenessImpl::Beat(grpc::ServerContext* context, const loom::v1::NodeBeat* request,
                                    loom::v1::NodeBeatAck* reply) {
  absl::StatusOr<auth::Identity> caller = auth_->Admit(*context, "/loom.v1.NodeLiveness/Beat");
  if (!caller.ok()) return ToGrpc(caller.status());
  if (absl::Status s = auth::AuthorizeRegister(*caller, request->node_id(), "NodeBeat.node_id");
      !s.ok()) {
    return ToGrpc(s);
  }
  // The time it was read: what the node timeout and the agent's lease count from.
  switch (nodes_->Beat(request->node_id(), context->peer(), absl::Now())) {
    case NodeRegistry::BeatResult::kHeard:
      reply->set_seq(request->seq());
      return grpc::Status::OK;
    case NodeRegistry::BeatResult::kUnknown:
      return ToGrpc(absl::FailedPreconditionError(absl::StrCat(
          "node ", request->node_id(), " has not registered with this coordinator")));
    case NodeRegistry::BeatResult::kNoSession:
      return ToGrpc(absl::FailedPreconditionError(
          absl::StrCat("node ", request->node_id(),
                       " has no open session with this coordinator; a beat alone does not keep "
                       "a node live")));
    case NodeRegistry::BeatResult::kElsewhere:
      return ToGrpc(absl::FailedPreconditionError(
          absl::StrCat("node ", request->node_id(),
                       "'s session runs on another connection; a beat counts only on its "
                       "session's (is another agent running for this node?)")));
    case NodeRegistry::BeatResult::kLost:
      return ToGrpc(absl::FailedPreconditionError(
          absl::StrCat("node ", request->node_id(),
                       " was declared lost; its session's next heartbeat brings it back")));
  }
  return grpc::Status(grpc::StatusCode::INTERNAL, "unreachable");
}

}  // namespace loom::coordinator
