// The one way a checkpoint step is saved, whatever the layout: every rank
// that holds a unique piece of the state writes its shards (each with its
// place in the global tensor, CheckpointSlice), and one rank commits one
// index once all of them have written. A layout is only a different set of
// pieces per rank (one process: every tensor whole on rank 0; TP: slices
// along an axis; ZeRO: rectangles of a flat range; PP: each stage its
// chunks'), so the reader (checkpoint_reader.h) assembles any shard of any
// tensor from any layout's step.
//
// Protocol, collective over the mesh groups (each rank in exactly one group
// of each axis; the "first" rank is rank 0 of every group):
//   1. the first rank opens the step's temporary directory and broadcasts
//      its tag (the pid) along the groups;
//   2. every rank writes its files, model-rNNNNN.safetensors and
//      optimizer-rNNNNN.safetensors (NNNNN: its place in the mesh), and
//      describes them in pieces-rNNNNN.json; the digests (integers, never
//      floats) are all-gathered along the groups;
//   3. the first rank reads the descriptions, asks the commit gate (below),
//      commits the step with every file's digest (checkpoint_writer.h:
//      durable files, the commit-fault hooks, pruning) and broadcasts whether
//      it did.
// Device backends: the files' data must already be in host memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"

namespace loom::engine {

// Asked by the committing rank once every shard is written, just before it
// writes the index and the commit record and renames the step into place: the
// fence that keeps a superseded attempt from committing
// (docs/fault_tolerance.md, "Fencing"). OK: commit. UNAVAILABLE or
// DEADLINE_EXCEEDED (the gate could not answer in time): the step is skipped,
// its temporary directory removed, and every rank returns "" as after a
// commit (the gate says so in its own log). Anything else (the attempt is
// superseded): the step is abandoned the same way and every rank fails with
// PERMISSION_DENIED naming the step and the gate's answer.
using CommitGate = std::function<absl::Status(int64_t step)>;

// mesh: the groups whose product is the job's ranks, innermost first (null
// entries are axes of one rank). content: step, model, state, and this rank's
// files (group "model" / "optimizer", tensors with host data and one slice
// each; names are assigned here; empty files are not written). gate: null,
// or asked before the commit (above). Returns the committed directory on the
// first rank and "" on the others; every rank fails if the step was not
// committed (except when the gate skipped it).
absl::StatusOr<std::string> SaveDistributedStep(kernels::Ops& ops,
                                                const std::vector<comm::Communicator*>& mesh,
                                                const std::string& root,
                                                const CheckpointContent& content, int64_t keep,
                                                const CommitGate& gate = nullptr);

}  // namespace loom::engine
