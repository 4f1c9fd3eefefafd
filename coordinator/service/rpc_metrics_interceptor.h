// Counts every RPC the coordinator answers by method and status code
// (loom_rpcs_total), including calls rejected before a handler runs.
#pragma once

#include <string>

#include "grpcpp/support/server_interceptor.h"

namespace loom::coordinator {

class CoordinatorMetrics;

class RpcMetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(CoordinatorMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  CoordinatorMetrics* metrics_;
};

// "OK", "INVALID_ARGUMENT", ...
const char* StatusCodeName(grpc::StatusCode code);
// The method label of loom_rpcs_total: the full method name for the methods
// this coordinator serves (Loom's services, health, reflection), else "other".
std::string RpcMethodLabel(const std::string& method);

}  // namespace loom::coordinator
