// loomctl's node verbs: nodes, uncordon.
#include <cstdio>

#include "client/job_format.h"
#include "client/loomctl_context.h"
#include "client/loomctl_verbs.h"
#include "common/rpc/rpc_settings.h"

namespace loom::client {

int RunNodes(const Args&) {
  loom::v1::ListNodesResponse response;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->ListNodes(context.get(), {}, &response);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s", FormatNodeTable({response.nodes().begin(), response.nodes().end()}).c_str());
  return 0;
}

int RunUncordon(const Args& args) {
  loom::v1::UncordonNodeRequest request;
  request.set_node_id(args[1]);
  loom::v1::Node node;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->UncordonNode(context.get(), request, &node);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s uncordoned\n", node.node_id().c_str());
  return 0;
}

}  // namespace loom::client
