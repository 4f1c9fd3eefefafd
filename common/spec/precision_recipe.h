// The one precision-recipe descriptor: what each train.precision means to
// every part that cares (the backends' GEMM dtype, the bytes the engine stores
// a value in, the planner's memory recipe, the peak-table column MFU is
// measured against). The spec names the recipe; everything else reads this
// table instead of mapping the enum itself (the YAML spelling, PrecisionName,
// the CUDA backend's recipe, which is the GEMM dtype, the planner's memory
// recipe). Pure, header data only.
#pragma once

#include <cstddef>
#include <iterator>
#include <cstdint>
#include <string_view>

#include "common/hardware/device_peaks.h"
#include "common/spec/job_spec.h"

namespace loom::spec {

// The memory recipes the planner knows (planner/precision.h holds their bytes
// per parameter): Loom's engine's, which train.precision names below, and the
// textbook and framework recipes its profiles (nanotron, Megatron) model.
enum class MemoryRecipe {
  kFp32,                  // fp32 everything (Loom's engine at precision fp32)
  kBf16,                  // bf16 weights and grads, fp32 master and Adam
  kBf16Fp32Accum,         // as kBf16, plus an fp32 gradient-accumulation buffer
  kFp8TransformerEngine,  // bf16 weights + cached fp8 copy, fp32 accumulation
  kFp8DeepSeekV3,         // fp8 working weights, fp32 master and grads, bf16 Adam moments
  // Loom's engine: fp32 weights (they are the master copy), gradients,
  // activations and Adam; each GEMM casts its operands to bf16 (or quantizes
  // the linear layers' to e4m3) on the fly (docs/gpu.md).
  kLoomBf16Cast,
  kLoomFp8Cast,
};

struct PrecisionRecipe {
  Precision precision;
  std::string_view name;   // train.precision's spelling
  hardware::Dtype gemm;    // what the GEMMs compute in (kernels' recipe, CPU emulation)
  int64_t bytes_per_value;  // weights, gradients and Adam states as the engine stores them
  MemoryRecipe memory;     // the planner's memory per parameter
  hardware::Dtype peak;    // the dense peak MFU is measured against
};

// Loom's engine keeps fp32 weights (the master copy), gradients and Adam
// states for every recipe; bf16 and fp8 cast each GEMM's operands on the fly.
// One row per Precision, in the enum's order (checked below).
inline constexpr PrecisionRecipe kPrecisionRecipes[] = {
    {Precision::kFp32, "fp32", hardware::Dtype::kFp32, 4, MemoryRecipe::kFp32,
     hardware::Dtype::kFp32},
    {Precision::kBf16, "bf16", hardware::Dtype::kBf16, 4, MemoryRecipe::kLoomBf16Cast,
     hardware::Dtype::kBf16},
    {Precision::kFp8, "fp8", hardware::Dtype::kFp8, 4, MemoryRecipe::kLoomFp8Cast,
     hardware::Dtype::kFp8},
};

constexpr bool RecipesInEnumOrder() {
  for (size_t i = 0; i < std::size(kPrecisionRecipes); ++i) {
    if (static_cast<size_t>(kPrecisionRecipes[i].precision) != i) return false;
  }
  return std::size(kPrecisionRecipes) == static_cast<size_t>(Precision::kFp8) + 1;
}
static_assert(RecipesInEnumOrder(), "kPrecisionRecipes needs one row per Precision, in order");

inline constexpr const PrecisionRecipe& RecipeOf(Precision precision) {
  return kPrecisionRecipes[static_cast<size_t>(precision)];
}

}  // namespace loom::spec
