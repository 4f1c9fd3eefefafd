#include "coordinator/service/rpc_metrics_interceptor.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "loom/v1/rank.pb.h"

#include "coordinator/service/metrics.h"

namespace loom::coordinator {
namespace {

using grpc::experimental::InterceptionHookPoints;

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(grpc::experimental::ServerRpcInfo* info, CoordinatorMetrics* metrics)
      : method_(RpcMethodLabel(info->method() ? info->method() : "")), metrics_(metrics) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->CountRpc(method_, StatusCodeName(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  std::string method_;
  CoordinatorMetrics* metrics_;
};

}  // namespace

grpc::experimental::Interceptor* RpcMetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new RpcMetricsInterceptor(info, metrics_);
}

// A method's label: its full name when it is one of the services this
// coordinator serves, else "other". A label value a client chooses would add a
// series per made-up name.
std::string RpcMethodLabel(const std::string& method) {
  static const std::set<std::string>* const known = [] {
    auto* names = new std::set<std::string>{"/grpc.health.v1.Health/Check",
                                            "/grpc.health.v1.Health/Watch"};
    const google::protobuf::DescriptorPool* pool =
        google::protobuf::DescriptorPool::generated_pool();
    for (const char* service :
         {"loom.v1.JobService", "loom.v1.NodeService", "loom.v1.RankService",
          "grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"}) {
      const google::protobuf::ServiceDescriptor* descriptor = pool->FindServiceByName(service);
      if (descriptor == nullptr) continue;
      for (int i = 0; i < descriptor->method_count(); ++i) {
        names->insert(absl::StrCat("/", service, "/", descriptor->method(i)->name()));
      }
    }
    return names;
  }();
  return known->count(method) > 0 ? method : "other";
}

const char* StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

}  // namespace loom::coordinator
