#include "coordinator/service/quota_service.h"

#include <cstdio>
#include <set>

#include "coordinator/service/status_convert.h"

namespace loom::coordinator {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(status));
  return reactor;
}

QuotaChange ChangeOf(const loom::v1::SetQuotaRequest& r) {
  QuotaChange change;
  change.user = r.user();
  change.group = r.group();
  if (r.set_devices()) {
    change.device_kind = r.device_kind();
    change.devices = r.devices();
  }
  if (r.set_member_of()) change.member_of = r.member_of();
  if (r.set_max_priority()) change.max_priority = r.max_priority();
  change.remove_max_priority = r.remove_max_priority();
  return change;
}

}  // namespace

loom::v1::Quota QuotaOf(const QuotaTable& table, const std::string& user,
                        const std::string& group) {
  loom::v1::Quota quota;
  const std::string& name = user.empty() ? group : user;
  const auto& limits = user.empty() ? table.quotas.groups : table.quotas.users;
  if (user.empty()) {
    quota.set_group(group);
  } else {
    quota.set_user(user);
  }
  for (auto it = limits.lower_bound({name, ""}); it != limits.end() && it->first.first == name;
       ++it) {
    loom::v1::DeviceQuota* d = quota.add_devices();
    d->set_kind(it->first.second);
    d->set_devices(it->second);
  }
  if (!user.empty()) {
    if (auto g = table.quotas.group_of.find(user); g != table.quotas.group_of.end()) {
      quota.set_member_of(g->second);
    }
    if (auto cap = table.max_priority.find(user); cap != table.max_priority.end()) {
      quota.set_has_max_priority(true);
      quota.set_max_priority(cap->second);
    }
  }
  return quota;
}

loom::v1::ListQuotasResponse ListQuotas(const QuotaTable& table,
                                        const loom::v1::ListQuotasRequest& request) {
  std::set<std::string> users, groups;
  if (!request.user().empty()) {
    users.insert(request.user());
    if (auto g = table.quotas.group_of.find(request.user()); g != table.quotas.group_of.end()) {
      groups.insert(g->second);
    }
  } else if (!request.group().empty()) {
    groups.insert(request.group());
  } else {
    for (const auto& [key, devices] : table.quotas.users) users.insert(key.first);
    for (const auto& [user, group] : table.quotas.group_of) users.insert(user);
    for (const auto& [user, cap] : table.max_priority) users.insert(user);
    for (const auto& [key, devices] : table.quotas.groups) groups.insert(key.first);
  }
  loom::v1::ListQuotasResponse response;
  for (const std::string& user : users) *response.add_quotas() = QuotaOf(table, user, "");
  for (const std::string& group : groups) *response.add_quotas() = QuotaOf(table, "", group);
  return response;
}

grpc::ServerUnaryReactor* QuotaServiceImpl::SetQuota(grpc::CallbackServerContext* context,
                                                     const loom::v1::SetQuotaRequest* request,
                                                     loom::v1::Quota* response) {
  absl::StatusOr<auth::Identity> caller = auth_->Admit(*context, "/loom.v1.QuotaService/SetQuota");
  if (!caller.ok()) return Done(context, caller.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool queued = writes_.TrySubmit([this, request, response, reactor, who = caller->name] {
    if (absl::Status s = book_->Apply(ChangeOf(*request)); !s.ok()) {
      reactor->Finish(ToGrpc(s));
      return;
    }
    std::fprintf(stderr, "quota: %s changed the quota of %s %s\n", who.c_str(),
                 request->user().empty() ? "group" : "user",
                 (request->user().empty() ? request->group() : request->user()).c_str());
    *response = QuotaOf(*book_->Current(), request->user(), request->group());
    reactor->Finish(grpc::Status::OK);
  });
  if (!queued) {
    reactor->Finish(ToGrpc(
        absl::ResourceExhaustedError("too many quota changes wait to be stored; retry")));
  }
  return reactor;
}

grpc::ServerUnaryReactor* QuotaServiceImpl::ListQuotas(grpc::CallbackServerContext* context,
                                                       const loom::v1::ListQuotasRequest* request,
                                                       loom::v1::ListQuotasResponse* response) {
  absl::StatusOr<auth::Identity> caller =
      auth_->Admit(*context, "/loom.v1.QuotaService/ListQuotas");
  if (!caller.ok()) return Done(context, caller.status());
  *response = coordinator::ListQuotas(*book_->Current(), *request);
  return Done(context, absl::OkStatus());
}

}  // namespace loom::coordinator
