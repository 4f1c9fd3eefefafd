// A survivor's part of writing the in-memory snapshots as a checkpoint step
// (StopRanks.spill_step; docs/fault_tolerance.md, "Shrink";
// engine/snapshot/snapshot_spill.h): the in-place recovery found no room for
// the failed ranks, so the job restarts re-planned onto the devices left,
// from the step the survivors and the failed ranks' buddies all hold. Each
// survivor writes its own snapshot of that step and, when its ward is among
// the failed ranks, the copy it holds of the ward's, and says so under
// `loom/spill/<step>/r<rank>` in the attempt's store (the description's
// digest, or "error: ..."); the lowest surviving rank waits for every rank of
// the layout and commits the step behind the commit gate. Nothing is written
// when the job already has a committed step as new.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "loom/v1/node.pb.h"
#include "loom/v1/rank.pb.h"
#include "worker/comm/store.h"
#include "worker/engine/checkpoint/distributed_save.h"
#include "worker/engine/snapshot_keeper.h"

namespace loom::trainer {

struct SpillContext {
  const loom::v1::RankAssignment* assignment = nullptr;  // layout, world, checkpoint dir
  const spec::JobSpec* job = nullptr;
  int attempt = 0;     // the aborted attempt
  int ward_rank = -1;  // whose copies this rank holds in it
  comm::Store* store = nullptr;  // the attempt's namespace, with this rank's token
  engine::CommitGate gate;
  // How long the committer waits for the other ranks' files.
  absl::Duration timeout = absl::Seconds(60);
  std::function<void(const std::string&)> on_event;
};

// OK once this rank's part is done (and, on the committer, the step is
// committed or was not needed); an error naming what could not be written.
absl::Status SpillSnapshots(const loom::v1::StopRanks& order, engine::SnapshotKeeper& keeper,
                            const SpillContext& context);

}  // namespace loom::trainer
