// The CPU Communicator: Gloo over TCP. Ranks meet through a Store (the
// coordinator's per-job-attempt store in production, InProcessStore in unit
// tests), connect a full mesh, and run Gloo's collectives. Every operation is
// bounded by the timeout and comes back as a status naming the group and the
// operation; nothing Gloo throws crosses this boundary.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace loom::comm {

struct GlooOptions {
  std::string group_name;  // in errors and counters: "dp", "tp[0,1]"
  int rank = 0;            // this rank's index in the group, 0 <= rank < size
  int size = 1;
  // Namespace of the rendezvous keys. Every member passes the same prefix,
  // and no other communicator may use it (include job, attempt and group).
  std::string key_prefix;
  absl::Duration timeout = absl::Seconds(60);  // bound of every operation
  // Bound of the rendezvous (waiting for every member to join and connect);
  // zero means the same as timeout.
  absl::Duration rendezvous_timeout = absl::ZeroDuration();
  // Address to bind and to advertise to peers. Loopback suits ranks of one
  // machine; give the node's address (or interface) across machines.
  std::string hostname = "127.0.0.1";
  std::string interface;  // a network interface name; when set, hostname is ignored
};

// Blocks until every member has joined (or the rendezvous timeout passes).
// Errors: INVALID_ARGUMENT for bad options, DEADLINE_EXCEEDED naming the rank
// that never joined, UNAVAILABLE when connecting failed.
// Also sets SIGPIPE to ignored if it has its default action: a write to a
// dead peer's socket must become an error, not kill the process.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store& store, const GlooOptions& options);

}  // namespace loom::comm
