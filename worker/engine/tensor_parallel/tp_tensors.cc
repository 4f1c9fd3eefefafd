#include "worker/engine/tensor_parallel/tp_tensors.h"

#include <cmath>
#include <span>

namespace loom::engine {
namespace {

// Calls fn(local_index, global_index, count) for each contiguous run of the
// slice (a whole tensor, row blocks for axis 0, one run per row for axis 1).
template <typename Fn>
void ForEachRun(const TensorView& v, Fn fn) {
  if (!v.sharded()) {
    fn(0, 0, v.numel());
    return;
  }
  const std::vector<int64_t>& g = v.GlobalShape();
  int64_t inner = 1;  // elements per index of shard_axis, in the global tensor
  for (size_t d = static_cast<size_t>(v.shard_axis) + 1; d < g.size(); ++d) inner *= g[d];
  int64_t outer = 1;
  for (int d = 0; d < v.shard_axis; ++d) outer *= g[static_cast<size_t>(d)];
  const int64_t width = v.shape[static_cast<size_t>(v.shard_axis)] * inner;
  const int64_t global_width = g[static_cast<size_t>(v.shard_axis)] * inner;
  for (int64_t o = 0; o < outer; ++o) {
    fn(o * width, o * global_width + v.shard_offset * inner, width);
  }
}

}  // namespace

absl::Status GatherGlobal(const TensorView& local, comm::Communicator* tp,
                          std::vector<float>* global) {
  int64_t n = 1;
  for (int64_t d : local.GlobalShape()) n *= d;
  global->assign(static_cast<size_t>(n), 0.0f);
  const bool grouped = tp != nullptr && tp->size() > 1;
  if (!grouped || tp->rank() % local.replicas == 0) {
    ForEachRun(local, [&](int64_t from, int64_t to, int64_t count) {
      std::copy_n(local.data + from, count, global->begin() + to);
    });
  }
  if (!grouped) return absl::OkStatus();
  return tp->AllReduce(std::span<float>(global->data(), global->size()));
}

void ScatterGlobal(const std::vector<float>& global, const TensorView& local) {
  ForEachRun(local, [&](int64_t to, int64_t from, int64_t count) {
    std::copy_n(global.begin() + from, count, local.data + to);
  });
}

// ---- Backend memory ---------------------------------------------------------------

namespace {
constexpr int64_t kFloat = static_cast<int64_t>(sizeof(float));
}  // namespace

absl::Status GatherGlobal(kernels::Ops& ops, const TensorView& local, comm::Communicator* tp,
                          std::vector<float>* global) {
  if (ops.device() == kernels::DeviceType::kCpu) return GatherGlobal(local, tp, global);
  int64_t n = 1;
  for (int64_t d : local.GlobalShape()) n *= d;
  global->assign(static_cast<size_t>(n), 0.0f);
  const bool grouped = tp != nullptr && tp->size() > 1;
  if (!grouped && !local.sharded()) {  // the tensor itself: one download
    ops.CopyDeviceToHost(global->data(), local.data, n * kFloat);
    return absl::OkStatus();
  }
  kernels::Buffer assembled = ops.AllocateFloats(n);
  ops.Fill(assembled.f32(), n, 0.0f);
  if (!grouped || tp->rank() % local.replicas == 0) {
    ForEachRun(local, [&](int64_t from, int64_t to, int64_t count) {
      ops.CopyDeviceToDevice(assembled.f32() + to, local.data + from, count * kFloat);
    });
  }
  if (grouped) {
    if (absl::Status s = tp->AllReduce(std::span<float>(assembled.f32(), static_cast<size_t>(n)));
        !s.ok()) {
      return s;
    }
  }
  ops.CopyDeviceToHost(global->data(), assembled.data(), n * kFloat);
  return absl::OkStatus();
}

void ScatterGlobal(kernels::Ops& ops, const std::vector<float>& global, const TensorView& local) {
  ForEachRun(local, [&](int64_t to, int64_t from, int64_t count) {
    ops.CopyHostToDevice(local.data + to, global.data() + from, count * kFloat);
  });
}

}  // namespace loom::engine
