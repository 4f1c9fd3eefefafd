// Collectives on a few host floats (a loss, a norm's share, commit flags,
// file digests) over a communicator that, like NCCL, takes only backend
// memory: on a device backend the values go up into a small backend buffer,
// through the collective, and back down; on a host backend (CpuOps with
// Gloo) the communicator reads them in place, as it always did.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"

namespace loom::engine {

// Sum over the group, or the root's values everywhere, in place. Nothing to
// do without a group of more than one rank (group may be null).
absl::Status AllReduceHostFloats(kernels::Ops& ops, comm::Communicator* group, float* values,
                                 int64_t n);
absl::Status BroadcastHostFloats(kernels::Ops& ops, comm::Communicator* group, float* values,
                                 int64_t n, int root);

}  // namespace loom::engine
