// Checkpoints of an expert-parallel layout hold global tensors: every dense
// tensor once and every routed expert under its global name, as a
// one-process checkpoint does. An EP rank holds only its experts, so their
// tensors (parameters and AdamW moments) are gathered over the EP group and
// renamed to the expert each source rank holds. The loader takes tensors by
// name, so the checkpoint loads under any EP size and on one process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

// `name` with its routed-expert index replaced by `expert` (the part after
// ".mlp.experts."); unchanged for any other tensor.
std::string WithExpert(const std::string& name, int64_t expert);

struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// The whole model's tensors from this EP rank's whole tensors (host; the
// rank holds `held` experts from first_expert = rank * held): dense ones as
// they are, each expert tensor gathered over `ep` (one all-gather per tensor
// through backend memory, collective over the group) as `ep` size tensors,
// source rank r's named for its expert r * held + (e - first_expert).
absl::StatusOr<std::vector<HostTensor>> GatherExpertTensors(kernels::Ops& ops, comm::Communicator* ep,
                                                            std::vector<HostTensor> local, int64_t held);

}  // namespace loom::engine
