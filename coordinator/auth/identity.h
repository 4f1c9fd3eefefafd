// Who is calling: the identity the coordinator derives from the peer's
// certificate (as gRPC's auth context reports it) or from a bearer token it
// issued, never from a request field. Pure values; see authenticate.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom::coordinator::auth {

enum class Role {
  kAdmin,        // sees and cancels every job, manages nodes and tokens
  kUser,         // submits and manages its own jobs
  kNode,         // a node agent (and, with a rank token, the ranks it runs)
  kCoordinator,  // the coordinator's own certificate; no API rights
  kInsecure,     // --insecure: no identities, everything allowed
};

std::string_view RoleName(Role role);

// What a rank token grants: one rank of one attempt of one job, on one node.
struct RankClaim {
  std::string job_id;
  int32_t attempt = 0;
  int32_t rank = 0;
  std::string node_id;
  std::string store_namespace;
};

// What proved the identity: a user token names a user only as far as an
// admin chose the name, so it never stands for the certificate of that name.
enum class Credential { kCertificate, kToken, kNone };

struct Identity {
  Role role = Role::kUser;
  std::string name;  // a user, admin or node name
  std::optional<RankClaim> rank;  // set when a node's call carries a valid rank token
  Credential credential = Credential::kCertificate;
};

// The owner of the jobs this identity submits, and whom MaySeeJob compares:
// the name for a certificate, "token:<name>" for a user token (':' is in no
// valid name), so a token minted for "admin" or "alice" is not the owner of
// the jobs of the certificate of that name, nor of its checkpoints.
std::string OwnerName(const Identity& identity);

// Names that may come from a certificate or a token: [A-Za-z0-9._-], 1 to 64
// characters (they end up in logs, paths and metric labels).
bool IsValidName(std::string_view name);

}  // namespace loom::coordinator::auth
