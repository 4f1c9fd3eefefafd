#include "coordinator/auth/identity.h"

namespace loom::coordinator::auth {

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin: return "admin";
    case Role::kUser: return "user";
    case Role::kNode: return "node";
    case Role::kCoordinator: return "coordinator";
    case Role::kInsecure: return "insecure";
  }
  return "unknown";
}

std::string OwnerName(const Identity& identity) {
  if (identity.credential == Credential::kToken) return "token:" + identity.name;
  return identity.name;
}

bool IsValidName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace loom::coordinator::auth
