// NodeLivenessImpl: the agents' liveness beats (proto/loom/v1/liveness.proto)
// on a path nothing else can starve. It is a synchronous service: gRPC serves
// it on threads of its own (the server's sync pool), never on the callback
// threads that every other service shares, so a beat is read and answered
// while those threads are all busy (a launch burst, a slow store, a flood of
// calls). A handler takes one registry lock and nothing else: no job table,
// no store, no waiting.
#pragma once

#include "coordinator/cluster/node_registry.h"
#include "coordinator/service/caller_identity.h"
#include "loom/v1/liveness.grpc.pb.h"

namespace loom::coordinator {

class NodeLivenessImpl final : public loom::v1::NodeLiveness::Service {
 public:
  NodeLivenessImpl(NodeRegistry* nodes, const CallerAuth* auth) : nodes_(nodes), auth_(auth) {}

  grpc::Status Beat(grpc::ServerContext* context, const loom::v1::NodeBeat* request,
                    loom::v1::NodeBeatAck* reply) override;

 private:
  NodeRegistry* nodes_;
  const CallerAuth* auth_;
};

}  // namespace loom::coordinator
