// loomctl quota set|get|list (admin): the devices of each kind a user or a
// group may hold at once, the group a user counts in, and a user's highest
// scheduling.priority (docs/scheduling.md).
//
//   loomctl quota set --user=alice [--gpu_quota=8|none] [--cpu_quota=N|none]
//                     [--group=ml|none] [--max_priority=N|none]
//   loomctl quota set --group=ml [--gpu_quota=16|none] [--cpu_quota=N|none]
//   loomctl quota get --user=alice | --group=ml
//   loomctl quota list
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/quota.grpc.pb.h"

namespace loom::client {

// What `quota set` asks for, from its flags' values ("" not given; "none"
// removes); INVALID_ARGUMENT naming the flag and the rule.
struct QuotaFlags {
  std::string user, group, gpu, cpu, max_priority;
};
absl::StatusOr<std::vector<loom::v1::SetQuotaRequest>> QuotaSetRequests(const QuotaFlags& flags);

// The table quota get and list print (pure).
std::string FormatQuotas(const loom::v1::ListQuotasResponse& quotas);

// args: {"quota", "set"|"get"|"list"}; flags from the command line.
int RunQuota(const std::vector<std::string>& args, const QuotaFlags& flags,
             loom::v1::QuotaService::StubInterface& stub,
             const std::function<int(const grpc::Status&)>& fail,
             const std::function<int(const std::string&)>& usage_error);

}  // namespace loom::client
