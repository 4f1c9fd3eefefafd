// The one place that decides which kernels::Ops backend a job trains on, from
// resources.device and train.precision (docs/engine.md, "Device memory"):
//
//   cpu + fp32 -> CpuOps                  cpu + fp8  -> Fp8EmulationOps
//   cpu + bf16 -> Bf16EmulationOps (when this build has it; else refused)
//   gpu + any  -> CudaOps on the rank's local device with the precision's
//                 recipe (only in a build with CUDA)
//
// and the rule that a GPU job trains one rank: the data-, tensor- and
// pipeline-parallel paths still stage their communication through host
// memory, so they run on the CPU backend only.
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
// without CUDA or when no CUDA device can be opened (with CUDA's reason);
// INVALID_ARGUMENT for train.precision=bf16 on the CPU when the build has no
// bf16 emulation.
absl::StatusOr<std::shared_ptr<kernels::Ops>> MakeOpsForJob(const spec::JobSpec& job,
                                                            int local_device = 0);

// FAILED_PRECONDITION when a backend other than the CPU's (resources.device=
// gpu, or `on_device`) would train with more than one rank in any of dp, tp,
// pp (the sizes this rank's groups really have); OK otherwise.
absl::Status CheckDeviceLayout(const spec::JobSpec& job, bool on_device, int dp, int tp, int pp);

// Whether this loom-trainer was built with the CUDA backend.
bool BuiltWithCuda();

}  // namespace loom::engine
