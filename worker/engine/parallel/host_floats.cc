#include "worker/engine/parallel/host_floats.h"

#include <cstring>
#include <span>
#include <vector>

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

absl::Status BroadcastHostInts(kernels::Ops& ops, comm::Communicator* group, int32_t* values,
                               int64_t n, int root) {
  if (group == nullptr || group->size() <= 1 || n == 0) return absl::OkStatus();
  std::vector<float> slots(static_cast<size_t>(n));
  std::memcpy(slots.data(), values, static_cast<size_t>(n) * sizeof(int32_t));
  if (absl::Status s = BroadcastHostFloats(ops, group, slots.data(), n, root); !s.ok()) return s;
  std::memcpy(values, slots.data(), static_cast<size_t>(n) * sizeof(int32_t));
  return absl::OkStatus();
}

absl::Status AllGatherHostInts(kernels::Ops& ops, comm::Communicator* group, const int32_t* mine,
                               int64_t n, int32_t* all) {
  const int ranks = group != nullptr ? group->size() : 1;
  if (ranks <= 1 || n == 0) {
    std::memcpy(all, mine, static_cast<size_t>(n) * sizeof(int32_t));
    return absl::OkStatus();
  }
  const int64_t total = n * ranks;
  std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(total));
  std::memcpy(in.data(), mine, static_cast<size_t>(n) * sizeof(int32_t));
  absl::Status s;
  if (ops.device() == kernels::DeviceType::kCpu) {
    s = group->AllGather(std::span<const float>(in.data(), in.size()),
                         std::span<float>(out.data(), out.size()));
  } else {
    kernels::Buffer src = ops.AllocateFloats(n), dst = ops.AllocateFloats(total);
    ops.CopyHostToDevice(src.data(), in.data(), n * kFloat);
    s = group->AllGather(std::span<const float>(src.f32(), static_cast<size_t>(n)),
                         std::span<float>(dst.f32(), static_cast<size_t>(total)));
    if (s.ok()) ops.CopyDeviceToHost(out.data(), dst.data(), total * kFloat);
  }
  if (!s.ok()) return s;
  std::memcpy(all, out.data(), static_cast<size_t>(total) * sizeof(int32_t));
  return absl::OkStatus();
}

}  // namespace loom::engine
