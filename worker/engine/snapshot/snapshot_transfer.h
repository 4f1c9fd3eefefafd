// Moving a snapshot between the two ranks of a pair group
// (comm/pair_groups.h): a rank's copy to its buddy after each snapshot, and a
// survivor's copy to a relaunched rank at the start of an attempt. The
// sender sends a header (step, image size, or word that it holds no such
// snapshot), then the image in chunks of at most chunk_bytes with at most two
// in flight, then waits for the receiver's acknowledgement, so a copy counts
// only once the receiver has it whole and parsed. A transfer cut short (a
// peer died, the pair group was aborted) fails on both sides; the receiver's
// buffer is then not a snapshot (Snapshot::empty) and the caller keeps its
// previous complete one (snapshot_generations.h).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/pair_groups.h"
#include "worker/engine/snapshot/snapshot.h"

namespace loom::engine {

struct SnapshotTransferOptions {
  int64_t chunk_bytes = 4 << 20;
  // Each stream of transfers on one pair uses three tags from here (header,
  // chunks, acknowledgement), so a buddy copy and a restore copy never match
  // each other's messages.
  uint32_t tag = 0x5000;
};
inline constexpr uint32_t kBuddyCopyTag = 0x5000;
inline constexpr uint32_t kRestoreCopyTag = 0x5010;

struct SnapshotTransferStats {
  int64_t bytes = 0;
  double seconds = 0;
};

// Sends `snapshot` of `step` to the pair's other member; snapshot null (or of
// another step): tells it this rank holds none, and fails NOT_FOUND. Errors
// name the pair group and the step.
absl::Status SendSnapshot(comm::Communicator& pair, int64_t step, const Snapshot* snapshot,
                          const SnapshotTransferOptions& options,
                          SnapshotTransferStats* stats = nullptr);

// Receives the other member's snapshot of `step` into `into` (its buffer is
// reused), parses it, checks its step, and acknowledges it. NOT_FOUND when
// the sender holds none; DATA_LOSS for an image that does not parse.
absl::Status ReceiveSnapshot(comm::Communicator& pair, int64_t step, Snapshot* into,
                             const SnapshotTransferOptions& options,
                             SnapshotTransferStats* stats = nullptr);

}  // namespace loom::engine
