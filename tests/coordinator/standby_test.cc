// A standby coordinator's answers (coordinator/ha/standby_service.h) and the
// clients' side that follows the leader (common/rpc/coordinator_channel.h),
// over real loopback gRPC servers: a standby that names the leader, and a
// "leader" whose health service reports SERVING.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc/coordinator_channel.h"
#include "coordinator/ha/standby_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "loom/v1/job.grpc.pb.h"

namespace loom::coordinator::ha {
namespace {

struct Server {
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

// The "leader": JobService unimplemented, health SERVING.
loom::v1::JobService::Service* LeaderService() {
  static auto* service = new loom::v1::JobService::Service();
  return service;
}

Server Start(grpc::CallbackGenericService* generic, bool serving) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  if (generic != nullptr) {
    builder.RegisterCallbackGenericService(generic);
  } else {
    builder.RegisterService(LeaderService());
  }
  Server s{builder.BuildAndStart(), ""};
  s.address = absl::StrCat("127.0.0.1:", port);
  s.server->GetHealthCheckService()->SetServingStatus(serving);
  return s;
}

grpc::Status ListJobs(rpc::CoordinatorChannel& coordinators, grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  loom::v1::ListJobsResponse response;
  return loom::v1::JobService::NewStub(coordinators.channel())
      ->ListJobs(context, loom::v1::ListJobsRequest(), &response);
}

TEST(Standby, RefusesEveryCallNamingTheLeaderAndClientsFollowIt) {
  StandbyService standby;
  Server refusing = Start(&standby, /*serving=*/false);
  Server leader = Start(nullptr, /*serving=*/true);
  standby.SetLeader(leader.address);

  rpc::CoordinatorChannel coordinators(absl::StrCat(refusing.address, ",", leader.address),
                                       grpc::InsecureChannelCredentials());
  ASSERT_TRUE(coordinators.several());
  EXPECT_EQ(coordinators.address(), refusing.address);
  grpc::ClientContext context;
  grpc::Status status = ListJobs(coordinators, &context);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(status.error_message().find("standby"), std::string::npos) << status.error_message();
  EXPECT_NE(status.error_message().find(leader.address), std::string::npos);
  coordinators.Failed(status, &context);
  EXPECT_EQ(coordinators.address(), leader.address);

  // Health: the standby is NOT_SERVING, so FindLeader never picks it.
  rpc::CoordinatorChannel fresh(absl::StrCat(refusing.address, ",", leader.address),
                                grpc::InsecureChannelCredentials());
  EXPECT_TRUE(fresh.FindLeader());
  EXPECT_EQ(fresh.address(), leader.address);
}

TEST(Standby, WithoutALeaderClientsTryTheNextAddressAndIgnoreStrangers) {
  StandbyService first_service;
  StandbyService second_service;
  Server first = Start(&first_service, false);
  Server second = Start(&second_service, false);
  rpc::CoordinatorChannel coordinators(absl::StrCat(first.address, ",", second.address),
                                       grpc::InsecureChannelCredentials());
  EXPECT_FALSE(coordinators.FindLeader(absl::Milliseconds(500)));

  grpc::ClientContext context;
  grpc::Status status = ListJobs(coordinators, &context);
  EXPECT_NE(status.error_message().find("no coordinator leads"), std::string::npos);
  coordinators.Failed(status, &context);
  EXPECT_EQ(coordinators.address(), second.address);

  // A leader the client was not given is not followed.
  second_service.SetLeader("10.9.9.9:1");
  grpc::ClientContext again;
  status = ListJobs(coordinators, &again);
  coordinators.Failed(status, &again);
  EXPECT_EQ(coordinators.address(), first.address);

  // Errors other than UNAVAILABLE are the leader's answers: no move.
  grpc::ClientContext other;
  coordinators.Failed(grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job"), &other);
  EXPECT_EQ(coordinators.address(), first.address);
}

}  // namespace
}  // namespace loom::coordinator::ha
