// Who may call what (docs/security.md). Pure functions of an Identity and the
// facts of the request; each refusal is PERMISSION_DENIED with a one-line
// reason (UNAUTHENTICATED is authenticate.h's). Role::kInsecure may do
// everything: --insecure turns identities off.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "coordinator/auth/identity.h"

namespace loom::coordinator::auth {

// Method-level gate, by the full gRPC method name ("/loom.v1.JobService/ListJobs").
// Unknown methods are refused.
absl::Status AuthorizeMethod(const Identity& caller, const std::string& method);

// Whether method has a rule at all (every Loom RPC must; a test walks the protos).
bool HasRule(const std::string& method);

// The answer for a job id that names no job: also the answer for another
// owner's job, so that job ids cannot be enumerated by probing.
absl::Status JobNotFound(const std::string& job_id);

// The caller acts on a job owned by owner: its owner or an admin. Anyone
// else gets JobNotFound, exactly as for a job that does not exist.
absl::Status AuthorizeJob(const Identity& caller, const std::string& job_id,
                          const std::string& owner);
// Whether caller sees a job in lists (same rule, as a bool).
bool MaySeeJob(const Identity& caller, const std::string& owner);

// A node session registers node_id: only under its own certificate's name.
absl::Status AuthorizeRegister(const Identity& caller, const std::string& node_id);

// A rendezvous-store call in namespace ns: only the caller's attempt namespace.
absl::Status AuthorizeStore(const Identity& caller, const std::string& ns);

}  // namespace loom::coordinator::auth
