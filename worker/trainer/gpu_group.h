// The communicator of one mesh group of a GPU job: NCCL over the job's store,
// its collectives ordered after the work the rank's CUDA backend has issued
// (the backend's compute stream). A group of one needs no NCCL. Builds
// without NCCL answer FAILED_PRECONDITION naming what is missing, so a GPU
// job of several ranks fails at start, not at its first collective.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace loom::trainer {

// members: the group's global ranks in group order; ops: the rank's backend
// (a CUDA backend when the build has one).
absl::StatusOr<std::unique_ptr<comm::Communicator>> CreateGpuGroup(
    comm::Store& store, const std::string& axis, const std::vector<int>& members, int my_rank,
    absl::Duration timeout, kernels::Ops& ops);

}  // namespace loom::trainer
