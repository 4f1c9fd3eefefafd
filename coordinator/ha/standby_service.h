// What a standby coordinator serves on --listen while another leads: every
// Loom RPC fails with UNAVAILABLE, a message naming the leader and trailing
// metadata "loom-leader: HOST:PORT" (absent while no leader is known), so
// clients given several coordinator addresses go to the leader
// (common/rpc/coordinator_channel.h). grpc.health.v1 reports NOT_SERVING.
#pragma once

#include <string>

#include "absl/synchronization/mutex.h"
#include "common/rpc/coordinator_channel.h"
#include "grpcpp/generic/async_generic_service.h"

namespace loom::coordinator::ha {

using rpc::kLeaderMetadataKey;  // one name, shared with the clients that read it

class StandbyService final : public grpc::CallbackGenericService {
 public:
  void SetLeader(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override;

 private:
  absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::coordinator::ha
