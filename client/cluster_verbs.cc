// loomctl's node verbs: nodes, drain, uncordon.
#include <cstdio>

#include "absl/flags/flag.h"

#include "client/job_format.h"
#include "client/loomctl_context.h"
#include "client/loomctl_verbs.h"
#include "common/rpc/rpc_settings.h"

ABSL_FLAG(std::string, reason, "", "drain: why, for the node's cordon and the jobs' histories");

namespace loom::client {

int RunNodes(const Args&) {
  loom::v1::ListNodesResponse response;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->ListNodes(context.get(), {}, &response);
  if (!status.ok()) return RpcFail(status);
  std::printf("%s", FormatNodeTable({response.nodes().begin(), response.nodes().end()}).c_str());
  return 0;
}

int RunDrain(const Args& args) {
  loom::v1::DrainNodeRequest request;
  request.set_node_id(args[1]);
  request.set_reason(absl::GetFlag(FLAGS_reason));
  loom::v1::Node node;
  auto context = loom::rpc::UnaryContext();
  grpc::Status status = Stub()->DrainNode(context.get(), request, &node);
  if (!status.ok()) return RpcFail(status);
  std::printf(
      "%s drained: it takes no new work; its jobs stop after their next step, saved, and resume "
      "elsewhere (loomctl uncordon %s to use it again)\n",
      node.node_id().c_str(), node.node_id().c_str());
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
