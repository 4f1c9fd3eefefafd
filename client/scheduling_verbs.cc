// loomctl's scheduling verbs: queue (the waiting jobs in order, with why each
// waits) and quota set|get|list (admin). The calls and tables live in
// queue_verb.cc and quota_verb.cc; this file binds them to the verb table.
#include "absl/flags/flag.h"
#include "client/loomctl_context.h"
#include "client/loomctl_verbs.h"
#include "client/queue_verb.h"
#include "client/quota_verb.h"
#include "common/cli/parse_flags.h"
#include "loom/v1/quota.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, user);  // auth_verbs.cc
ABSL_FLAG(std::string, group, "",
          "quota set|get: the group (with --user: the group the user counts in; none: no group)");
ABSL_FLAG(std::string, gpu_quota, "", "quota set: gpu devices the user or group may hold; none");
ABSL_FLAG(std::string, cpu_quota, "", "quota set: cpu devices the user or group may hold; none");
ABSL_FLAG(std::string, max_priority, "",
          "quota set --user: the highest scheduling.priority the user may ask for; none");

namespace loom::client {

int RunQueue(const Args&) { return RunQueue(*Stub(), RpcFail); }

int RunQuota(const Args& args) {
  return RunQuota(args,
                  {.user = absl::GetFlag(FLAGS_user),
                   .group = absl::GetFlag(FLAGS_group),
                   .gpu = absl::GetFlag(FLAGS_gpu_quota),
                   .cpu = absl::GetFlag(FLAGS_cpu_quota),
                   .max_priority = absl::GetFlag(FLAGS_max_priority)},
                  *loom::v1::QuotaService::NewStub(Channel()), RpcFail,
                  [](const std::string& m) -> int { loom::cli::UsageError(m); });
}

}  // namespace loom::client
