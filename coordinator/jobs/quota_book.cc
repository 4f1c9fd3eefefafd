#include "coordinator/jobs/quota_book.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "coordinator/auth/identity.h"

namespace loom::coordinator {
namespace {

bool IsDeviceKind(const std::string& kind) { return kind == "cpu" || kind == "gpu"; }

// The most devices one quota may name, and the widest priority cap: those
// of the job spec's bounds (docs/limits.md).
constexpr int64_t kMaxDevices = int64_t{1} << 20;
constexpr int64_t kMaxPriority = 1'000'000;

}  // namespace

bool QuotaTable::operator==(const QuotaTable& other) const {
  return quotas.users == other.quotas.users && quotas.groups == other.quotas.groups &&
         quotas.group_of == other.quotas.group_of && max_priority == other.max_priority;
}

std::string FormatQuotaTable(const QuotaTable& table) {
  std::string out;
  for (const auto& [key, devices] : table.quotas.users) {
    absl::StrAppend(&out, "user ", key.first, " ", key.second, " ", devices, "\n");
  }
  for (const auto& [key, devices] : table.quotas.groups) {
    absl::StrAppend(&out, "group ", key.first, " ", key.second, " ", devices, "\n");
  }
  for (const auto& [user, group] : table.quotas.group_of) {
    absl::StrAppend(&out, "member ", user, " ", group, "\n");
  }
  for (const auto& [user, cap] : table.max_priority) {
    absl::StrAppend(&out, "max_priority ", user, " ", cap, "\n");
  }
  return out;
}

absl::StatusOr<QuotaTable> ParseQuotaTable(const std::string& text, const std::string& source) {
  QuotaTable table;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    auto bad = [&](const std::string& rule) {
      return absl::DataLossError(absl::StrCat(source, ":", number, ": ", rule));
    };
    std::istringstream fields(line);
    std::string what, name, third, extra;
    if (!(fields >> what >> name >> third) || !auth::IsValidName(name)) {
      return bad("expected 'user|group NAME KIND DEVICES', 'member USER GROUP' or "
                 "'max_priority USER N'");
    }
    if (what == "user" || what == "group") {
      int64_t devices = 0;
      if (!IsDeviceKind(third) || !(fields >> devices) || devices < 0 || devices > kMaxDevices) {
        return bad(absl::StrCat("expected '", what, " NAME cpu|gpu DEVICES' with 0 <= DEVICES <= ",
                                kMaxDevices));
      }
      (what == "user" ? table.quotas.users : table.quotas.groups)[{name, third}] = devices;
    } else if (what == "member") {
      if (!auth::IsValidName(third)) return bad("expected 'member USER GROUP'");
      table.quotas.group_of[name] = third;
    } else if (what == "max_priority") {
      int64_t cap = 0;
      std::istringstream number_text(third);
      if (!(number_text >> cap) || cap < -kMaxPriority || cap > kMaxPriority) {
        return bad("expected 'max_priority USER N' with |N| <= 1000000");
      }
      table.max_priority[name] = cap;
    } else {
      return bad(absl::StrCat("unknown entry '", what, "'"));
    }
    if (fields >> extra) return bad("too many fields");
  }
  return table;
}

absl::StatusOr<std::unique_ptr<QuotaBook>> QuotaBook::Open(auth::TokenPersistence persistence) {
  absl::StatusOr<std::string> text = persistence.load();
  if (!text.ok()) return text.status();
  absl::StatusOr<QuotaTable> table = ParseQuotaTable(*text, persistence.name);
  if (!table.ok()) return table.status();
  std::unique_ptr<QuotaBook> book(new QuotaBook(std::move(persistence)));
  auto current = std::make_shared<const QuotaTable>(*std::move(table));
  absl::MutexLock lock(&book->read_mu_);
  book->table_ = std::move(current);
  return book;
}

std::shared_ptr<const QuotaTable> QuotaBook::Current() const {
  absl::MutexLock lock(&read_mu_);
  return table_;
}

absl::Status QuotaBook::CheckPriority(const std::string& user, int64_t priority) const {
  std::shared_ptr<const QuotaTable> table = Current();
  auto cap = table->max_priority.find(user);
  if (cap == table->max_priority.end() || priority <= cap->second) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("scheduling.priority=", priority,
                                                 " must be at most ", cap->second, ", ", user,
                                                 "'s cap (an admin sets it: loomctl quota set "
                                                 "--user=", user, " --max_priority=N)"));
}

absl::Status QuotaBook::Apply(const QuotaChange& change) {
  const bool is_user = !change.user.empty();
  if (is_user == !change.group.empty()) {
    return absl::InvalidArgumentError("a quota change names exactly one of user and group");
  }
  const std::string& name = is_user ? change.user : change.group;
  if (!auth::IsValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(is_user ? "user" : "group", "='", name,
                                                   "' is not a valid name"));
  }
  if (change.devices.has_value()) {
    if (!IsDeviceKind(change.device_kind)) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_kind='", change.device_kind, "' must be cpu or gpu"));
    }
    if (*change.devices > kMaxDevices) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices=", *change.devices, " must be at most ", kMaxDevices));
    }
  }
  if (!is_user && (change.member_of || change.max_priority || change.remove_max_priority)) {
    return absl::InvalidArgumentError("member_of and max_priority are set for a user, not a group");
  }
  if (change.member_of && !change.member_of->empty() && !auth::IsValidName(*change.member_of)) {
    return absl::InvalidArgumentError(
        absl::StrCat("member_of='", *change.member_of, "' is not a valid group name"));
  }
  if (change.max_priority && (*change.max_priority < -kMaxPriority ||
                              *change.max_priority > kMaxPriority)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_priority=", *change.max_priority, " must be between -1000000 and 1000000"));
  }
  absl::MutexLock write(&write_mu_);
  QuotaTable next = *Current();
  if (change.devices.has_value()) {
    auto& limits = is_user ? next.quotas.users : next.quotas.groups;
    if (*change.devices < 0) {
      limits.erase({name, change.device_kind});
    } else {
      limits[{name, change.device_kind}] = *change.devices;
    }
  }
  if (change.member_of) {
    if (change.member_of->empty()) {
      next.quotas.group_of.erase(name);
    } else {
      next.quotas.group_of[name] = *change.member_of;
    }
  }
  if (change.remove_max_priority) next.max_priority.erase(name);
  if (change.max_priority) next.max_priority[name] = *change.max_priority;
  if (absl::Status saved = persistence_.save(FormatQuotaTable(next)); !saved.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the quotas could not be saved to ", persistence_.name, ": ", saved.message(),
                     "; nothing changed"));
  }
  auto current = std::make_shared<const QuotaTable>(std::move(next));
  absl::MutexLock lock(&read_mu_);
  table_ = std::move(current);
  return absl::OkStatus();
}

}  // namespace loom::coordinator
