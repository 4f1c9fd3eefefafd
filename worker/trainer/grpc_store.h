// The rendezvous store of one job attempt, reached through the node agent
// (AgentService's store calls on its Unix socket, with the rank's token),
// which relays them to the coordinator's RankService. Gloo's rendezvous and
// any other per-attempt agreement go through it; keys live in the attempt's
// namespace so attempts never mix.
#pragma once

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "loom/v1/node.grpc.pb.h"
#include "worker/comm/store.h"

namespace loom::trainer {

class GrpcStore final : public comm::Store {
 public:
  // agent: the agent's socket ("unix:PATH", loom-trainer --agent_socket).
  GrpcStore(const std::string& agent, std::string rank_token, std::string store_namespace);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;

  std::unique_ptr<loom::v1::AgentService::Stub> agent_;
  const std::string authorization_;  // "Bearer <rank token>" (secret)
  const std::string namespace_;
};

}  // namespace loom::trainer
