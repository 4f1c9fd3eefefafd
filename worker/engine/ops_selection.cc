#include "worker/engine/ops_selection.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/precision_recipe.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fp8_emulation_ops.h"
#include "kernels/cpu/bf16_emulation_ops.h"
#if defined(LOOM_ENGINE_HAVE_CUDA)
#include "kernels/cuda/backend/cuda_ops.h"
#endif

namespace loom::engine {
namespace {

absl::StatusOr<std::shared_ptr<kernels::Ops>> MakeGpuOps(const spec::JobSpec& job,
                                                         int local_device) {
#if defined(LOOM_ENGINE_HAVE_CUDA)
  kernels::cuda::CudaOpsOptions options;
  options.device = local_device;
  options.recipe = spec::RecipeOf(job.train.precision).gemm;  // CudaRecipe is the GEMM dtype
  std::string error;
  std::unique_ptr<kernels::cuda::CudaOps> ops = kernels::cuda::CudaOps::Create(options, &error);
  if (ops == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resources.device=gpu: cannot open CUDA device ", local_device, " (CUDA_VISIBLE_DEVICES "
        "selects the rank's GPU): ", error.empty() ? "no reason given" : error));
  }
  return std::shared_ptr<kernels::Ops>(std::move(ops));
#else
  (void)job;
  (void)local_device;
  return absl::FailedPreconditionError(
      "resources.device=gpu: this loom-trainer was built without CUDA (no nvcc/CUDA toolkit at "
      "configure time, or -DLOOM_WITH_CUDA=OFF); rebuild it on a machine with the CUDA toolkit, "
      "or run the job with resources.device=cpu");
#endif
}

}  // namespace

bool BuiltWithCuda() {
#if defined(LOOM_ENGINE_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::shared_ptr<kernels::Ops>> MakeOpsForJob(const spec::JobSpec& job,
                                                            int local_device) {
  if (job.resources.device == spec::DeviceKind::kGpu) return MakeGpuOps(job, local_device);
  switch (spec::RecipeOf(job.train.precision).gemm) {
    case hardware::Dtype::kFp32:
    case hardware::Dtype::kTf32:
      return std::shared_ptr<kernels::Ops>(kernels::cpu::MakeCpuOps());
    case hardware::Dtype::kFp8:
      // The linear layers' GEMMs see e4m3-rounded inputs with DeepSeek-V3
      // scaling, emulated on the CPU.
      return std::shared_ptr<kernels::Ops>(kernels::cpu::MakeFp8EmulationOps());
    case hardware::Dtype::kBf16:
      // Every GEMM's and attention's operands rounded to bf16, as CudaOps's
      // bf16 recipe computes them.
      return std::shared_ptr<kernels::Ops>(kernels::cpu::MakeBf16EmulationOps());
  }
  return absl::InvalidArgumentError("train.precision: unknown value");
}

}  // namespace loom::engine
