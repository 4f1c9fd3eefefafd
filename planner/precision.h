// Precision recipes: how many bytes each parameter costs in weights,
// gradients, gradient accumulation, master copy and optimizer states, and in
// what dtype the GEMMs run. The memory model divides each component by the
// parallel axes and the ZeRO stage that shard it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/hardware/device_peaks.h"
#include "common/spec/job_spec.h"
#include "common/spec/precision_recipe.h"

namespace loom::planner {

// The dtype a recipe's GEMMs run in: the peak table's (common/hardware).
using ComputeDtype = hardware::Dtype;

// The memory recipes (common/spec/precision_recipe.h): Loom's engine's, which
// train.precision names, and those of the framework profiles.
using RecipeKind = spec::MemoryRecipe;

struct PrecisionRecipe {
  RecipeKind kind;
  std::string_view name;
  ComputeDtype compute;
  // Bytes per parameter, by what ZeRO shards them: stage 3 shards weights,
  // stage 2 also gradients and the accumulation buffer, stage 1 the rest.
  double weight_bytes;      // working copy the GEMMs read
  double grad_bytes;        // gradient in the compute dtype
  double grad_accum_bytes;  // fp32 accumulation buffer (0: none)
  double master_bytes;      // fp32 master copy (0 when the weights are it)
  double optimizer_bytes;   // Adam's two moments
  double grad_reduce_bytes;     // element size of the DP gradient reduction
  double activation_bytes;      // element size of saved activations
  std::string_view description;

  double total_bytes() const {
    return weight_bytes + grad_bytes + grad_accum_bytes + master_bytes + optimizer_bytes;
  }
};

const PrecisionRecipe& Recipe(RecipeKind kind);
// Every recipe, one per RecipeKind in the enum's order. Names: fp32, bf16,
// bf16-fp32-accum, fp8-te, fp8-deepseek-v3, loom-bf16-cast, loom-fp8-cast.
const std::vector<PrecisionRecipe>& AllRecipes();
// The recipe Loom's engine uses for train.precision (what it stores, not the
// textbook recipe of the same name: the cast recipes for bf16 and fp8), the
// precision descriptor's (spec::RecipeOf(precision).memory).
RecipeKind RecipeForPrecision(spec::Precision precision);

}  // namespace loom::planner
