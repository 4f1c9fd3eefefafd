#include "worker/engine/expert_parallel/ep_checkpoint.h"

#include <span>

#include "worker/engine/expert_parallel/ep_gradients.h"

namespace loom::engine {
namespace {

constexpr char kTag[] = ".mlp.experts.";

int64_t ExpertIndex(const std::string& name) {
  const size_t at = name.find(kTag);
  return at == std::string::npos ? -1 : std::stoll(name.substr(at + sizeof(kTag) - 1));
}

}  // namespace

std::string WithExpert(const std::string& name, int64_t expert) {
  const size_t at = name.find(kTag);
  if (at == std::string::npos) return name;
  const size_t first = at + sizeof(kTag) - 1;
  const size_t end = name.find('.', first);
  return name.substr(0, first) + std::to_string(expert) + (end == std::string::npos ? "" : name.substr(end));
}

absl::StatusOr<std::vector<HostTensor>> GatherExpertTensors(kernels::Ops& ops, comm::Communicator* ep,
                                                            const std::vector<TensorView>& local,
                                                            int64_t held) {
  const int ranks = ep != nullptr ? ep->size() : 1;
  const int rank = ep != nullptr ? ep->rank() : 0;
  std::vector<HostTensor> out;
  ops.Synchronize();
  for (const TensorView& v : local) {
    const int64_t n = v.numel();
    const bool expert = IsExpertParameter(v.name);
    if (!expert || ranks == 1) {
      HostTensor t{v.name, v.shape, std::vector<float>(static_cast<size_t>(n))};
      if (n > 0) ops.CopyDeviceToHost(t.data.data(), v.data, n * static_cast<int64_t>(sizeof(float)));
      out.push_back(std::move(t));
      continue;
    }
    kernels::Buffer all = ops.AllocateFloats(n * ranks);
    if (absl::Status s = ep->AllGather(std::span<const float>(v.data, static_cast<size_t>(n)),
                                       std::span<float>(all.f32(), static_cast<size_t>(n * ranks)));
        !s.ok()) {
      return s;
    }
    const int64_t local_index = ExpertIndex(v.name) - rank * held;
    for (int r = 0; r < ranks; ++r) {
      HostTensor t{WithExpert(v.name, r * held + local_index), v.shape, std::vector<float>(static_cast<size_t>(n))};
      ops.CopyDeviceToHost(t.data.data(), all.f32() + r * n, n * static_cast<int64_t>(sizeof(float)));
      out.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace loom::engine
