// The one precision-recipe descriptor: what each train.precision means to
// every part that cares (the backends' GEMM dtype, the bytes the engine stores
// a value in, the planner's memory recipe, the peak-table column MFU is
// measured against). The spec names the recipe; everything else reads this
// table instead of mapping the enum itself (the YAML spelling, PrecisionName,
// the CUDA backend's recipe, which is the GEMM dtype). Pure, header data only.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/hardware/device_peaks.h"
#include "common/spec/job_spec.h"

namespace loom::spec {

struct PrecisionRecipe {
  Precision precision;
  std::string_view name;            // train.precision's spelling
  hardware::Dtype gemm;             // what the GEMMs compute in (kernels' recipe, CPU emulation)
  int64_t bytes_per_value;          // weights, gradients and Adam states as the engine stores them
  std::string_view planner_recipe;  // coordinator/planner/precision.h recipe (memory per parameter)
  hardware::Dtype peak;             // the dense peak MFU is measured against
};

// Loom's engine keeps fp32 weights (the master copy), gradients and Adam
// states for every recipe; bf16 and fp8 cast each GEMM's operands on the fly.
inline constexpr PrecisionRecipe kPrecisionRecipes[] = {
    {Precision::kFp32, "fp32", hardware::Dtype::kFp32, 4, "fp32", hardware::Dtype::kFp32},
    {Precision::kBf16, "bf16", hardware::Dtype::kBf16, 4, "loom-bf16-cast", hardware::Dtype::kBf16},
    {Precision::kFp8, "fp8", hardware::Dtype::kFp8, 4, "loom-fp8-cast", hardware::Dtype::kFp8},
};

inline const PrecisionRecipe& RecipeOf(Precision precision) {
  for (const PrecisionRecipe& r : kPrecisionRecipes) {
    if (r.precision == precision) return r;
  }
  return kPrecisionRecipes[0];
}

}  // namespace loom::spec
