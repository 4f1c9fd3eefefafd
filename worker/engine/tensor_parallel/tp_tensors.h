// Whole-model operations on tensor-parallel shards (TensorViews whose sharding
// fields say where they sit, as LlamaModel hands them out): moving a tensor
// between its global form and this rank's slice (for checkpoints and export).
// The global gradient norm over shards is ClipGradients
// (optim/clip_gradients.h). Each is collective over
// the TP group where it takes one; a null group means "not sharded".
//
// Two forms: the ones taking `kernels::Ops&` work on backend memory (device
// memory on a GPU: the tensors are touched only through the ops, and what
// the group exchanges is backend memory too, as NCCL requires); the ones
// without read and write the views on the host (CPU backends only).
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/parallel/host_floats.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

// The global tensor of `local` (GlobalShape(), row-major) on every rank of
// the group. Replicated slices are held by consecutive ranks; the first of
// them (tp rank % replicas == 0) contributes it.
absl::Status GatherGlobal(const TensorView& local, comm::Communicator* tp,
                          std::vector<float>* global);

// Copies this rank's slice of `global` (GlobalShape(), row-major) into
// local.data. Local, no communication.
void ScatterGlobal(const std::vector<float>& global, const TensorView& local);

// ---- The same on backend memory ----------------------------------------------
// `local` is backend memory; the global tensor is assembled (and summed over
// the group) in a backend buffer, then copied down into *global (host).
absl::Status GatherGlobal(kernels::Ops& ops, const TensorView& local, comm::Communicator* tp,
                          std::vector<float>* global);
// Copies this rank's slice of `global` (host) up into local.data (backend).
void ScatterGlobal(kernels::Ops& ops, const std::vector<float>& global, const TensorView& local);


}  // namespace loom::engine
