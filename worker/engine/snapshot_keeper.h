// A rank's in-memory snapshots across the attempts of a job (in-place
// recovery, docs/fault_tolerance.md): its own and the copies of its
// ward's, in the generations common/snapshot_generations.h says (and why); the snapshot policy (every
// fault_tolerance.snapshot_interval steps); the copy of each snapshot to the
// buddy in the background (snapshot_copier.h); and the rollbacks: to its own
// snapshot, to one received from a peer, and the copy it sends a relaunched
// rank. The generations outlive the attempts; the ring (pair groups) is one
// attempt's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/snapshot_generations.h"
#include "worker/comm/communicator.h"
#include "worker/engine/progress.h"
#include "worker/engine/snapshot/snapshot_copier.h"
#include "worker/engine/snapshot/snapshot_generations.h"
#include "worker/engine/snapshot/snapshot_transfer.h"

namespace loom::engine {

class TrainingLoop;

struct SnapshotKeeperOptions {
  int64_t interval = 1;  // fault_tolerance.snapshot_interval; 0: no snapshots
  int rank = -1;         // this rank's global rank: names its snapshots
  int64_t chunk_bytes = 4 << 20;
  // The buddy copies' threads at the lowest CPU priority (SnapshotCopier;
  // off by default, as PairGroupOptions::background).
  bool background_copies = false;
  // Events worth a log line (a copy that failed).
  std::function<void(const std::string&)> on_event;
};

class SnapshotKeeper {
 public:
  explicit SnapshotKeeper(SnapshotKeeperOptions options);
  ~SnapshotKeeper();

  // This attempt's ring: the pair group with the buddy (receives this rank's
  // copies) and the one with the ward (sends its copies), null where there
  // is none, and the ward's global rank. Copies held of another ward are
  // replaced by the first copy from this one.
  void AttachRing(comm::Communicator* to_buddy, comm::Communicator* from_ward, int ward_rank);
  // Ends the ring (abort its pair groups first to cut a copy in flight
  // short; a copy cut short leaves the previous complete generation).
  void DetachRing();

  bool Due(int64_t step) const { return options_.interval > 0 && step % options_.interval == 0; }
  // After step p->step of `loop`: when a snapshot is due, waits for the
  // previous copies to be acknowledged, expects the ward's copy of this step,
  // captures this rank's state and sends it to the buddy in the background.
  // Fills p->snapshot either way.
  absl::Status AfterStep(TrainingLoop& loop, StepProgress* p);
  // Waits for the copies in flight (the end of training).
  void WaitForCopies();

  // Rolls `loop` back to this rank's own snapshot of `step` and forgets the
  // newer ones (own and ward's: they will be taken again). FAILED_PRECONDITION
  // naming what it holds when it has none of that step.
  absl::Status RestoreOwn(TrainingLoop& loop, int64_t step);
  // A loss spike's rollback (training_run.cc): rolls `loop` back to its
  // newest own snapshot before `step` (RestoreOwn) and returns that
  // snapshot's step; NOT_FOUND when it holds none before it.
  absl::StatusOr<int64_t> RollBackBefore(TrainingLoop& loop, int64_t step);
  // A relaunched rank: receives its snapshot of `step` from the peer at the
  // other end of `pair` (its buddy in the attempt that failed), keeps it as
  // its own and restores `loop` from it.
  absl::Status RestoreFromPeer(TrainingLoop& loop, comm::Communicator& pair, int64_t step);
  // Sends the copy of `step` this rank holds of `owner` (its former ward) to
  // the other end of `pair`; without one, tells the peer so and fails.
  absl::Status SendCopyTo(comm::Communicator& pair, int owner, int64_t step);

  // What a spill writes (snapshot_spill.h): this rank's own snapshot of
  // `step`, and the copy it holds of `owner`'s (its ward's) completed from
  // its own; FAILED_PRECONDITION naming what it holds when it has none.
  absl::StatusOr<std::shared_ptr<const Snapshot>> OwnSnapshot(int64_t step) const;
  absl::StatusOr<std::shared_ptr<const Snapshot>> WardCopy(int owner, int64_t step);

  SnapshotProgress Holdings() const;
  const SnapshotKeeperOptions& options() const { return options_; }

 private:
  void CommitWardCopy(int ward_rank, std::shared_ptr<Snapshot> copy);
  void NoteCopyFailures();
  std::vector<uint64_t> HeldPieceKeys() const;

  const SnapshotKeeperOptions options_;
  SnapshotGenerations own_{kOwnSnapshotGenerations};
  SnapshotGenerations ward_{kWardSnapshotGenerations};
  mutable std::mutex ward_mu_;
  int ward_rank_ = -1;  // whose copies ward_ holds
  int ring_ward_ = -1;  // this attempt's ward
  std::unique_ptr<SnapshotCopier> copier_;
  bool reported_copy_failure_ = false;
};

}  // namespace loom::engine
