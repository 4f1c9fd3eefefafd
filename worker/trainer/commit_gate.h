// The commit gate over the attempt's rendezvous store (docs/fault_tolerance.md,
// "Fencing"): before the rank that commits a checkpoint renames it into place,
// it adds `loom/commit/<step>` (rpc::CommitKey, common/rpc/commit_gate.h) in
// its attempt's namespace. A superseded
// attempt's namespace is gone, so the add is refused and the checkpoint is
// abandoned (the rank then exits as fenced); UNAVAILABLE (an attempt that
// replaced a lost node waits for that node's lease to run out, or the
// coordinator is away) is retried with backoff for a bounded time, then the
// checkpoint is skipped with a log line. What the engine does with each
// answer is engine::CommitGate's contract (checkpoint/distributed_save.h).
#pragma once

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "worker/comm/store.h"
#include "worker/engine/checkpoint/distributed_save.h"

namespace loom::trainer {

struct CommitGateOptions {
  // How long UNAVAILABLE (and DEADLINE_EXCEEDED: the call could not be
  // relayed in time) is retried before the step is skipped. The other ranks
  // wait in a collective meanwhile: keep it well below the collective timeout.
  absl::Duration retry_for = absl::Seconds(30);
  absl::Duration first_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
};

// store must outlive the gate. on_event gets the skip's log line.
engine::CommitGate MakeStoreCommitGate(comm::Store* store, CommitGateOptions options,
                                       std::function<void(const std::string&)> on_event);

}  // namespace loom::trainer
