#include "worker/engine/model/host_floats.h"

#include <span>

namespace loom::engine {

namespace {

constexpr int64_t kFloat = static_cast<int64_t>(sizeof(float));

// Runs `collective` on n host floats: in place on a host-memory backend,
// else through a backend buffer copied up and back down.
template <typename Fn>
absl::Status OnBackendFloats(kernels::Ops& ops, float* values, int64_t n, Fn collective) {
  if (ops.device() == kernels::DeviceType::kCpu) {
    return collective(std::span<float>(values, static_cast<size_t>(n)));
  }
  kernels::Buffer staged = ops.AllocateFloats(n);
  ops.CopyHostToDevice(staged.data(), values, n * kFloat);
  absl::Status s = collective(std::span<float>(staged.f32(), static_cast<size_t>(n)));
  if (s.ok()) ops.CopyDeviceToHost(values, staged.data(), n * kFloat);
  return s;
}

}  // namespace

absl::Status AllReduceHostFloats(kernels::Ops& ops, comm::Communicator* group, float* values,
                                 int64_t n) {
  if (group == nullptr || group->size() <= 1 || n == 0) return absl::OkStatus();
  return OnBackendFloats(ops, values, n, [&](std::span<float> s) { return group->AllReduce(s); });
}

absl::Status BroadcastHostFloats(kernels::Ops& ops, comm::Communicator* group, float* values,
                                 int64_t n, int root) {
  if (group == nullptr || group->size() <= 1 || n == 0) return absl::OkStatus();
  return OnBackendFloats(ops, values, n,
                         [&](std::span<float> s) { return group->Broadcast(s, root); });
}

}  // namespace loom::engine
