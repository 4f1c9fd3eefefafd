// Every RPC in proto/loom/v1 has an authorization rule: a method added
// without one fails here (and is refused for everyone but --insecure).
#include "coordinator/auth/policy.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "loom/v1/auth.pb.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "loom/v1/quota.pb.h"
#include "loom/v1/rank.pb.h"

namespace loom::coordinator::auth {
namespace {

TEST(PolicyCoverageTest, EveryLoomMethodHasARule) {
  int methods = 0;
  // One message of each proto file leads to the file and its services.
  for (const google::protobuf::FileDescriptor* file :
       {loom::v1::Job::descriptor()->file(), loom::v1::RegisterNode::descriptor()->file(),
        loom::v1::RankAssignment::descriptor()->file(),
        loom::v1::CreateTokenRequest::descriptor()->file(),
        loom::v1::SetQuotaRequest::descriptor()->file()}) {
    for (int s = 0; s < file->service_count(); ++s) {
      const google::protobuf::ServiceDescriptor* each = file->service(s);
      // Served by the node agent on its local socket, not by the coordinator.
      if (each->full_name() == "loom.v1.AgentService") continue;
      for (int m = 0; m < each->method_count(); ++m) {
        const std::string method = "/" + each->full_name() + "/" + each->method(m)->name();
        EXPECT_TRUE(HasRule(method)) << method << " has no rule in coordinator/auth/policy.cc";
        ++methods;
      }
    }
  }
  EXPECT_GE(methods, 15);
}

}  // namespace
}  // namespace loom::coordinator::auth
