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
//
// A buddy copy leaves out what the buddy already holds: before it, the
// receiver names the pieces of its own snapshot (SnapshotPieceKey), the
// sender sends the image's header and manifest and only the other pieces'
// floats, and the received copy marks the left-out pieces as borrowed, to be
// filled from the buddy's own snapshot of the same step when the copy is
// used (Snapshot::FillBorrowed). Under data parallelism the replicated
// pieces (ZeRO-0's whole state, ZeRO-1's and -2's weights) never travel.
#pragma once

#include <cstdint>
#include <span>

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
  // Both ends of a stream set it alike: the receiver names what it holds
  // and the sender leaves it out (buddy copies).
  bool leave_out_held = false;
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
// the sender holds none; DATA_LOSS for an image that does not parse. With
// options.leave_out_held, `held` are the keys (SnapshotPieceKey) of the
// pieces this rank holds itself, which the sender leaves out.
absl::Status ReceiveSnapshot(comm::Communicator& pair, int64_t step, Snapshot* into,
                             const SnapshotTransferOptions& options,
                             SnapshotTransferStats* stats = nullptr,
                             std::span<const uint64_t> held = {});

}  // namespace loom::engine
