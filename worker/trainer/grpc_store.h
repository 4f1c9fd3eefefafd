// The rendezvous store of one job attempt, reached through the coordinator's
// RankService. Gloo's rendezvous and any other per-attempt agreement go
// through it; keys live in the attempt's namespace so attempts never mix.
#pragma once

#include <memory>
#include <string>

#include "common/rpc/coordinator_channel.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/rank.grpc.pb.h"
#include "worker/comm/store.h"

namespace loom::trainer {

class GrpcStore final : public comm::Store {
 public:
  GrpcStore(std::shared_ptr<rpc::CoordinatorChannel> coordinators, std::string store_namespace);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  std::shared_ptr<rpc::CoordinatorChannel> coordinators_;
  const std::string namespace_;
};

}  // namespace loom::trainer
