#include "coordinator/auth/policy.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "common/text/safe_text.h"

namespace loom::coordinator::auth {
namespace {

// Who may call each method: a set of roles, plus whether a rank token is needed.
struct Rule {
  bool admin = false;
  bool user = false;
  bool node = false;
  bool rank = false;  // a node that also holds a rank token
  bool anyone = false;
};

const std::map<std::string, Rule>& Rules() {
  static const auto* rules = new std::map<std::string, Rule>{
      {"/loom.v1.JobService/SubmitJob", {.admin = true, .user = true}},
      {"/loom.v1.JobService/PlanJob", {.admin = true, .user = true}},
      {"/loom.v1.JobService/GetJob", {.admin = true, .user = true}},
      {"/loom.v1.JobService/ListJobs", {.admin = true, .user = true}},
      {"/loom.v1.JobService/CancelJob", {.admin = true, .user = true}},
      {"/loom.v1.JobService/WatchJob", {.admin = true, .user = true}},
      {"/loom.v1.JobService/DeleteJob", {.admin = true, .user = true}},
      {"/loom.v1.JobService/StreamLogs", {.admin = true, .user = true}},
      {"/loom.v1.JobService/TraceJob", {.admin = true, .user = true}},
      {"/loom.v1.JobService/ListNodes", {.admin = true}},
      {"/loom.v1.JobService/ListQueue", {.admin = true, .user = true}},
      {"/loom.v1.JobService/UncordonNode", {.admin = true}},
      {"/loom.v1.JobService/DrainNode", {.admin = true}},
      {"/loom.v1.QuotaService/SetQuota", {.admin = true}},
      {"/loom.v1.QuotaService/ListQuotas", {.admin = true}},
      {"/loom.v1.AuthService/CreateToken", {.admin = true}},
      {"/loom.v1.AuthService/RevokeTokens", {.admin = true}},
      {"/loom.v1.AuthService/WhoAmI", {.anyone = true}},
      {"/loom.v1.NodeService/Session", {.node = true}},
      {"/loom.v1.RankService/StoreSet", {.rank = true}},
      {"/loom.v1.RankService/StoreGet", {.rank = true}},
      {"/loom.v1.RankService/StoreAdd", {.rank = true}},
      // The node itself; each op is authorized with its own rank token.
      {"/loom.v1.RankService/StoreBatch", {.node = true}},
  };
  return *rules;
}

absl::Status Denied(const Identity& caller, const std::string& what) {
  return absl::PermissionDeniedError(
      absl::StrCat(std::string(RoleName(caller.role)), " ", caller.name, " may not ", what));
}

}  // namespace

absl::Status AuthorizeMethod(const Identity& caller, const std::string& method) {
  if (caller.role == Role::kInsecure) return absl::OkStatus();
  auto it = Rules().find(method);
  if (it == Rules().end()) return Denied(caller, absl::StrCat("call ", method));
  const Rule& rule = it->second;
  const bool allowed = rule.anyone || (rule.admin && caller.role == Role::kAdmin) ||
                       (rule.user && caller.role == Role::kUser) ||
                       (rule.node && caller.role == Role::kNode) ||
                       (rule.rank && caller.role == Role::kNode && caller.rank.has_value());
  if (allowed) return absl::OkStatus();
  if (rule.rank && caller.role == Role::kNode) {
    return Denied(caller, absl::StrCat("call ", method, " without its rank token"));
  }
  return Denied(caller, absl::StrCat("call ", method));
}

bool HasRule(const std::string& method) { return Rules().count(method) > 0; }

bool MaySeeJob(const Identity& caller, const std::string& owner) {
  if (caller.role == Role::kInsecure || caller.role == Role::kAdmin) return true;
  return caller.role == Role::kUser && !owner.empty() && OwnerName(caller) == owner;
}

absl::Status AuthorizeJob(const Identity& caller, const std::string& job_id,
                          const std::string& owner) {
  if (MaySeeJob(caller, owner)) return absl::OkStatus();
  return JobNotFound(job_id);
}

absl::Status JobNotFound(const std::string& job_id) {
  return absl::NotFoundError(
      absl::StrCat("job ", SafeText(job_id, 64), " does not exist (loomctl list shows jobs)"));
}

absl::Status AuthorizeRegister(const Identity& caller, const std::string& node_id) {
  if (caller.role == Role::kInsecure) return absl::OkStatus();
  if (caller.role == Role::kNode && caller.name == node_id) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "RegisterNode.node_id must be the name in the node's certificate (", caller.name, ")"));
}

absl::Status AuthorizeStore(const Identity& caller, const std::string& ns) {
  if (caller.role == Role::kInsecure) return absl::OkStatus();
  if (caller.rank.has_value() && caller.rank->store_namespace == ns) return absl::OkStatus();
  return absl::PermissionDeniedError(
      "store_namespace is not the namespace of the caller's job attempt");
}

}  // namespace loom::coordinator::auth
