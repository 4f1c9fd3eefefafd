// The trainer of one rank of a coordinated job: reads the assignment the node
// agent wrote, meets its peers through the rendezvous store (relayed by its
// node agent to the coordinator), builds its communicators, trains with the
// checkpoint policy and streams progress to its node agent. It talks to
// nothing but its agent. Needs nothing from the coordinator's code but the proto.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/v1/rank.pb.h"

namespace loom::trainer {

absl::StatusOr<loom::v1::RankAssignment> ReadAssignment(const std::string& path);

// agent_socket: the node agent's endpoint ("unix:PATH").
absl::Status RunCoordinated(const loom::v1::RankAssignment& assignment,
                            const std::string& agent_socket);

}  // namespace loom::trainer
