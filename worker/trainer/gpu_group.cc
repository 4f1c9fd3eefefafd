#include "worker/trainer/gpu_group.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/comm/group_factory.h"
#include "worker/comm/self_communicator.h"

#if LOOM_TRAINER_WITH_NCCL
#include "kernels/cuda/backend/cuda_ops.h"
#include "worker/comm/nccl_communicator.h"
#endif

namespace loom::trainer {

absl::StatusOr<std::unique_ptr<comm::Communicator>> CreateGpuGroup(
    comm::Store& store, const std::string& axis, const std::vector<int>& members, int my_rank,
    absl::Duration timeout, kernels::Ops& ops) {
  const std::string name = comm::GroupDisplayName(axis, members);
  if (members.size() <= 1) return std::make_unique<comm::SelfCommunicator>(name);
  const auto me = std::find(members.begin(), members.end(), my_rank);
  if (me == members.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", my_rank, " is not a member of its ", name, " group"));
  }
#if LOOM_TRAINER_WITH_NCCL
  auto* cuda = dynamic_cast<kernels::cuda::CudaOps*>(&ops);
  if (cuda == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resources.device=gpu: group ", name, " needs the CUDA backend, the rank runs on '",
        ops.name(), "'"));
  }
  comm::NcclOptions options;
  options.group_name = name;
  options.rank = static_cast<int>(me - members.begin());
  options.size = static_cast<int>(members.size());
  options.key_prefix = comm::GroupKeyPrefix("", axis, members);
  options.timeout = timeout;
  options.device = cuda->device_index();
  options.compute_stream = cuda->stream();
  return comm::CreateNcclCommunicator(store, options);
#else
  (void)timeout;
  (void)ops;
  (void)store;
  return absl::FailedPreconditionError(absl::StrCat(
      "resources.device=gpu: group ", name, " needs NCCL, and this loom-trainer was built without "
      "it (configure with CUDA and nccl.h/libnccl, or -DLOOM_NCCL_ROOT=)"));
#endif
}

}  // namespace loom::trainer
