// Whole-model operations on tensor-parallel shards (TensorViews whose sharding
// fields say where they sit, as LlamaModel hands them out): the global
// gradient norm and clipping, and moving a tensor between its global form
// and this rank's slice (for checkpoints and export). Each is collective over
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
#include "worker/engine/model/host_floats.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

// The L2 norm of the whole model's gradient: this rank's sum of squares
// (each tensor's divided by its replicas, so replicated slices count once) is
// summed over the group. The same value on every rank of the group.
absl::StatusOr<double> TpGlobalNorm(const std::vector<TensorView>& grads, comm::Communicator* tp);

// ClipByGlobalNorm (optim/grad_clip.h) with the norm above: when max_norm > 0
// and the norm exceeds it, scales every local gradient by
// max_norm / (norm + 1e-6). Returns the norm before clipping.
absl::StatusOr<double> ClipByTpGlobalNorm(const std::vector<TensorView>& grads, double max_norm,
                                          comm::Communicator* tp);

// The global tensor of `local` (GlobalShape(), row-major) on every rank of
// the group. Replicated slices are held by consecutive ranks; the first of
// them (tp rank % replicas == 0) contributes it.
absl::Status GatherGlobal(const TensorView& local, comm::Communicator* tp,
                          std::vector<float>* global);

// Copies this rank's slice of `global` (GlobalShape(), row-major) into
// local.data. Local, no communication.
void ScatterGlobal(const std::vector<float>& global, const TensorView& local);

// ---- The same on backend memory ----------------------------------------------
// Each tensor's sum of squares is ops.SumSquares; the share crosses the group
// in a one-float backend buffer. Clipping scales with ops.Scale.
absl::StatusOr<double> TpGlobalNorm(kernels::Ops& ops, const std::vector<TensorView>& grads,
                                    comm::Communicator* tp);
absl::StatusOr<double> ClipByTpGlobalNorm(kernels::Ops& ops, const std::vector<TensorView>& grads,
                                          double max_norm, comm::Communicator* tp);
// `local` is backend memory; the global tensor is assembled (and summed over
// the group) in a backend buffer, then copied down into *global (host).
absl::Status GatherGlobal(kernels::Ops& ops, const TensorView& local, comm::Communicator* tp,
                          std::vector<float>* global);
// Copies this rank's slice of `global` (host) up into local.data (backend).
void ScatterGlobal(kernels::Ops& ops, const std::vector<float>& global, const TensorView& local);


}  // namespace loom::engine
