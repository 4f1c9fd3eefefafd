// Collectives on a few host numbers (a loss, a norm's share as floats; commit
// flags, a pid, file digests as integers) over a communicator that, like NCCL, takes only backend
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

// Control values (commit flags, a pid, file sizes and digests) as integers,
// exact whatever their size: each int32 rides in a float slot holding its
// bits, through a broadcast or an all-gather, which copy bytes and never add
// them. Broadcast: the root's values everywhere. AllGather: `all` receives
// every rank's n values in rank order (n * group size; with no group, the
// caller's own).
absl::Status BroadcastHostInts(kernels::Ops& ops, comm::Communicator* group, int32_t* values,
                               int64_t n, int root);
absl::Status AllGatherHostInts(kernels::Ops& ops, comm::Communicator* group, const int32_t* mine,
                               int64_t n, int32_t* all);

}  // namespace loom::engine
