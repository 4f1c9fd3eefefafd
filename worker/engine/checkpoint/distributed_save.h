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
//   3. the first rank reads the descriptions, commits the step with every
//      file's digest (checkpoint_writer.h: durable files, the commit-fault
//      hooks, pruning) and broadcasts whether it did.
// Device backends: the files' data must already be in host memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"

namespace loom::engine {

// mesh: the groups whose product is the job's ranks, innermost first (null
// entries are axes of one rank). content: step, model, state, and this rank's
// files (group "model" / "optimizer", tensors with host data and one slice
// each; names are assigned here; empty files are not written). Returns the
// committed directory on the first rank and "" on the others; every rank
// fails if the step was not committed.
absl::StatusOr<std::string> SaveDistributedStep(kernels::Ops& ops,
                                                const std::vector<comm::Communicator*>& mesh,
                                                const std::string& root,
                                                const CheckpointContent& content, int64_t keep);

}  // namespace loom::engine
