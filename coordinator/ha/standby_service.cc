#include "coordinator/ha/standby_service.h"

#include "absl/strings/str_cat.h"

namespace loom::coordinator::ha {
namespace {

// Answers at once; never reads the request.
class RefuseReactor final : public grpc::ServerGenericBidiReactor {
 public:
  RefuseReactor(grpc::GenericCallbackServerContext* context, const std::string& leader) {
    std::string message = "this coordinator is a standby; ";
    if (leader.empty()) {
      absl::StrAppend(&message, "no coordinator leads right now, retry shortly");
    } else {
      absl::StrAppend(&message, "the leader is at ", leader);
      context->AddTrailingMetadata(kLeaderMetadataKey, leader);
    }
    Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, message));
  }
  void OnDone() override { delete this; }
};

}  // namespace

void StandbyService::SetLeader(const std::string& address) {
  absl::MutexLock lock(&mu_);
  leader_ = address;
}

grpc::ServerGenericBidiReactor* StandbyService::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  std::string leader;
  {
    absl::MutexLock lock(&mu_);
    leader = leader_;
  }
  return new RefuseReactor(context, leader);
}

}  // namespace loom::coordinator::ha
