// The one place that decides which kernels::Ops backend a job trains on, from
// resources.device and train.precision (docs/engine.md, "Device memory"):
//
//   cpu + fp32 -> CpuOps                  cpu + fp8  -> Fp8EmulationOps
//   cpu + bf16 -> Bf16EmulationOps
//   gpu + any  -> CudaOps on the rank's local device with the precision's
//                 recipe (only in a build with CUDA)
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "kernels/ops.h"

namespace loom::engine {

// The backend for `job` on this rank. local_device is the CUDA device index
// (0 when the agent set CUDA_VISIBLE_DEVICES to the rank's device); ignored on
// the CPU. Errors: FAILED_PRECONDITION for resources.device=gpu in a build
// without CUDA or when no CUDA device can be opened (with CUDA's reason).
absl::StatusOr<std::shared_ptr<kernels::Ops>> MakeOpsForJob(const spec::JobSpec& job,
                                                            int local_device = 0);

// Whether this loom-trainer was built with the CUDA backend.
bool BuiltWithCuda();

}  // namespace loom::engine
