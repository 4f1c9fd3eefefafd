// One attempt's buddy copies, in the background: this rank's snapshots go to
// its buddy and its ward's come to it, each direction on its own thread and
// its own pair group (comm/pair_groups.h), overlapped with the next steps.
// One copy per direction at a time; the caller waits for both to be idle
// before it starts the next snapshot (SnapshotKeeper: the next snapshot
// waits for the previous copy to be acknowledged). Aborting the pair groups
// ends a copy in flight at once; the destructor then joins promptly.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/communicator.h"
#include "worker/engine/snapshot/snapshot.h"
#include "worker/engine/snapshot/snapshot_transfer.h"

namespace loom::engine {

class SerialWorker;

class SnapshotCopier {
 public:
  struct Ring {
    comm::Communicator* to_buddy = nullptr;   // the pair group with the buddy; null: none
    comm::Communicator* from_ward = nullptr;  // the pair group with the ward; null: none
  };
  // background: the copy threads run at the lowest CPU priority
  // (comm/background_priority.h), so a copy yields to training.
  SnapshotCopier(Ring ring, SnapshotTransferOptions options, bool background = false);
  ~SnapshotCopier();

  bool has_buddy() const { return ring_.to_buddy != nullptr; }
  bool has_ward() const { return ring_.from_ward != nullptr; }

  // Sends the snapshot to the buddy in the background.
  void SendToBuddy(std::shared_ptr<const Snapshot> snapshot);
  // Receives the ward's snapshot of `step` into `into` in the background and
  // hands it to `done` (on the copier's thread) once acknowledged. `held`:
  // the keys of the pieces this rank holds itself, which the ward leaves out
  // when the options say so (snapshot_transfer.h).
  void ReceiveFromWard(int64_t step, std::shared_ptr<Snapshot> into, std::vector<uint64_t> held,
                       std::function<void(std::shared_ptr<Snapshot>)> done);
  // Waits until no copy is in flight in either direction.
  void WaitIdle();

  struct SendResult {
    int64_t step = -1;  // -1: nothing sent yet
    absl::Status status;
    SnapshotTransferStats stats;
  };
  SendResult last_send() const;
  absl::Status last_receive() const;

 private:
  const Ring ring_;
  const SnapshotTransferOptions options_;
  mutable std::mutex mu_;
  SendResult last_send_;
  absl::Status last_receive_;
  std::unique_ptr<SerialWorker> sender_, receiver_;
};

}  // namespace loom::engine
