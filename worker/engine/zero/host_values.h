// Collectives on a few host values (a loss, a norm's partial sum, commit
// flags, file digests) over a communicator whose buffers must be the
// backend's memory: NCCL takes only device pointers. On a device backend the
// values go up into a small backend buffer, through the collective, and back
// down; on a host backend (CpuOps with Gloo) the communicator reads the host
// values directly, as before, so CPU results are unchanged. Header-only: the
// engine's library lists its sources elsewhere.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/device_staging.h"

namespace loom::engine {

// Runs collective(span) on the values, staged through backend memory when
// the backend's memory is not the host's.
template <typename Collective>
absl::Status OnBackendCopy(kernels::Ops& ops, std::span<float> values, Collective&& collective) {
  if (values.empty() || HostAddressable(ops)) return collective(values);
  const int64_t bytes = static_cast<int64_t>(values.size_bytes());
  kernels::Buffer buffer = ops.Allocate(bytes);
  ops.CopyHostToDevice(buffer.data(), values.data(), bytes);
  absl::Status status = collective(std::span<float>(buffer.f32(), values.size()));
  if (status.ok()) ops.CopyDeviceToHost(values.data(), buffer.data(), bytes);
  return status;
}

// Sum over the group, in place.
inline absl::Status AllReduceHostValues(kernels::Ops& ops, comm::Communicator& comm,
                                        std::span<float> values) {
  return OnBackendCopy(ops, values, [&comm](std::span<float> v) { return comm.AllReduce(v); });
}

// Root's values on every rank, in place.
inline absl::Status BroadcastHostValues(kernels::Ops& ops, comm::Communicator& comm,
                                        std::span<float> values, int root) {
  return OnBackendCopy(ops, values,
                       [&comm, root](std::span<float> v) { return comm.Broadcast(v, root); });
}

}  // namespace loom::engine
