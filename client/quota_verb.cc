#include "client/quota_verb.h"

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/rpc_settings.h"

namespace loom::client {
namespace {

// --gpu_quota / --cpu_quota: a device count, or none (no limit).
absl::Status AddDevices(const std::string& kind, const std::string& value,
                        const loom::v1::SetQuotaRequest& base,
                        std::vector<loom::v1::SetQuotaRequest>& out) {
  if (value.empty()) return absl::OkStatus();
  int64_t devices = -1;
  if (value != "none" && (!absl::SimpleAtoi(value, &devices) || devices < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", kind, "_quota=", value, " must be a device count >= 0 or none"));
  }
  loom::v1::SetQuotaRequest r = base;
  r.set_set_devices(true);
  r.set_device_kind(kind);
  r.set_devices(devices);
  out.push_back(std::move(r));
  return absl::OkStatus();
}

std::string DevicesText(const loom::v1::Quota& q, const std::string& kind) {
  for (const auto& d : q.devices()) {
    if (d.kind() == kind) return absl::StrCat(d.devices());
  }
  return "-";
}

}  // namespace

absl::StatusOr<std::vector<loom::v1::SetQuotaRequest>> QuotaSetRequests(const QuotaFlags& flags) {
  if (flags.user.empty() && flags.group.empty()) {
    return absl::InvalidArgumentError("quota set needs --user=NAME or --group=NAME");
  }
  loom::v1::SetQuotaRequest base;
  std::vector<loom::v1::SetQuotaRequest> out;
  if (!flags.user.empty()) {
    base.set_user(flags.user);
    // With --user, --group is the group the user counts in.
    if (!flags.group.empty()) {
      loom::v1::SetQuotaRequest r = base;
      r.set_set_member_of(true);
      r.set_member_of(flags.group == "none" ? "" : flags.group);
      out.push_back(std::move(r));
    }
    if (!flags.max_priority.empty()) {
      loom::v1::SetQuotaRequest r = base;
      int64_t cap = 0;
      if (flags.max_priority == "none") {
        r.set_remove_max_priority(true);
      } else if (absl::SimpleAtoi(flags.max_priority, &cap)) {
        r.set_set_max_priority(true);
        r.set_max_priority(cap);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--max_priority=", flags.max_priority, " must be an integer or none"));
      }
      out.push_back(std::move(r));
    }
  } else {
    base.set_group(flags.group);
    if (!flags.max_priority.empty()) {
      return absl::InvalidArgumentError("--max_priority is set for a --user, not a --group");
    }
  }
  if (absl::Status s = AddDevices("gpu", flags.gpu, base, out); !s.ok()) return s;
  if (absl::Status s = AddDevices("cpu", flags.cpu, base, out); !s.ok()) return s;
  if (out.empty()) {
    return absl::InvalidArgumentError(
        "quota set needs something to set: --gpu_quota, --cpu_quota, --group (with --user) or "
        "--max_priority");
  }
  return out;
}

std::string FormatQuotas(const loom::v1::ListQuotasResponse& quotas) {
  if (quotas.quotas().empty()) return "no quotas\n";
  std::string out = absl::StrFormat("%-24s %6s %6s  %-12s %s\n", "WHO", "GPU", "CPU", "GROUP",
                                    "MAX PRIORITY");
  for (const loom::v1::Quota& q : quotas.quotas()) {
    const std::string who = q.user().empty() ? absl::StrCat("group ", q.group())
                                             : absl::StrCat("user ", q.user());
    absl::StrAppend(&out, absl::StrFormat("%-24s %6s %6s  %-12s %s\n", who, DevicesText(q, "gpu"),
                                          DevicesText(q, "cpu"),
                                          q.member_of().empty() ? "-" : q.member_of(),
                                          q.has_max_priority() ? absl::StrCat(q.max_priority())
                                                               : "-"));
  }
  return out;
}

int RunQuota(const std::vector<std::string>& args, const QuotaFlags& flags,
             loom::v1::QuotaService::StubInterface& stub,
             const std::function<int(const grpc::Status&)>& fail,
             const std::function<int(const std::string&)>& usage_error) {
  const std::string sub = args.size() == 2 ? args[1] : "";
  if (sub == "set") {
    absl::StatusOr<std::vector<loom::v1::SetQuotaRequest>> requests = QuotaSetRequests(flags);
    if (!requests.ok()) return usage_error(std::string(requests.status().message()));
    loom::v1::Quota quota;
    for (const auto& request : *requests) {
      auto context = loom::rpc::UnaryContext();
      grpc::Status status = stub.SetQuota(context.get(), request, &quota);
      if (!status.ok()) return fail(status);
    }
    loom::v1::ListQuotasResponse shown;
    *shown.add_quotas() = quota;
    std::printf("%s", FormatQuotas(shown).c_str());
    return 0;
  }
  if (sub == "get" || sub == "list") {
    loom::v1::ListQuotasRequest request;
    if (sub == "get") {
      if (flags.user.empty() == flags.group.empty()) {
        return usage_error("quota get needs one of --user=NAME and --group=NAME");
      }
      request.set_user(flags.user);
      request.set_group(flags.group);
    }
    loom::v1::ListQuotasResponse response;
    auto context = loom::rpc::UnaryContext();
    grpc::Status status = stub.ListQuotas(context.get(), request, &response);
    if (!status.ok()) return fail(status);
    std::printf("%s", FormatQuotas(response).c_str());
    return 0;
  }
  return usage_error("quota needs set, get or list");
}

}  // namespace loom::client
