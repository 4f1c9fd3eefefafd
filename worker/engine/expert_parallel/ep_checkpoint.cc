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
                                                            std::vector<HostTensor> local, int64_t held) {
  const int ranks = ep != nullptr ? ep->size() : 1;
  const int rank = ep != nullptr ? ep->rank() : 0;
  constexpr int64_t kFloat = sizeof(float);
  std::vector<HostTensor> out;
  for (HostTensor& t : local) {
    const auto n = static_cast<int64_t>(t.data.size());
    if (!IsExpertParameter(t.name) || ranks == 1) {
      out.push_back(std::move(t));
      continue;
    }
    // The group exchanges backend memory (NCCL's rule), so the tensor goes up first.
    kernels::Buffer mine = ops.AllocateFloats(n), all = ops.AllocateFloats(n * ranks);
    ops.CopyHostToDevice(mine.data(), t.data.data(), n * kFloat);
    ops.Synchronize();
    if (absl::Status s = ep->AllGather(std::span<const float>(mine.f32(), static_cast<size_t>(n)),
                                       std::span<float>(all.f32(), static_cast<size_t>(n * ranks)));
        !s.ok()) {
      return s;
    }
    const int64_t local_index = ExpertIndex(t.name) - rank * held;
    for (int r = 0; r < ranks; ++r) {
      HostTensor g{WithExpert(t.name, r * held + local_index), t.shape, std::vector<float>(static_cast<size_t>(n))};
      ops.CopyDeviceToHost(g.data.data(), all.f32() + r * n, n * kFloat);
      out.push_back(std::move(g));
    }
  }
  return out;
}

}  // namespace loom::engine
