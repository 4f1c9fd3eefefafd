// The table of precision recipes. Byte counts follow the mixed-precision
// practice each recipe names (Micikevicius et al. for bf16 with fp32 master
// weights; Transformer Engine's cached fp8 weight copy; DeepSeek-V3's fp8
// GEMMs with bf16 Adam moments and fp32 master weights and gradients).
#include "planner/precision.h"


namespace loom::planner {
namespace {

std::vector<PrecisionRecipe> BuildTable() {
  return {
      {RecipeKind::kFp32, "fp32", ComputeDtype::kFp32, 4, 4, 0, 0, 8, 4, 4,
       "fp32 weights, gradients and Adam moments (16 B/param)"},
      {RecipeKind::kBf16, "bf16", ComputeDtype::kBf16, 2, 2, 0, 4, 8, 2, 2,
       "bf16 weights and gradients, fp32 master and Adam (16 B/param)"},
      {RecipeKind::kBf16Fp32Accum, "bf16-fp32-accum", ComputeDtype::kBf16, 2, 2, 4, 4, 8, 4, 2,
       "bf16 weights and gradients, fp32 accumulation, master and Adam (20 B/param)"},
      {RecipeKind::kFp8TransformerEngine, "fp8-te", ComputeDtype::kFp8, 3, 2, 4, 4, 8, 4, 2,
       "bf16 weights plus their fp8 copy, fp32 accumulation, master and Adam (21 B/param)"},
      {RecipeKind::kFp8DeepSeekV3, "fp8-deepseek-v3", ComputeDtype::kFp8, 1, 0, 4, 4, 4, 4, 2,
       "fp8 weights, fp32 gradients and master, bf16 Adam moments (13 B/param)"},
      {RecipeKind::kLoomBf16Cast, "loom-bf16-cast", ComputeDtype::kBf16, 4, 4, 0, 0, 8, 4, 4,
       "fp32 weights, gradients, activations and Adam, bf16 GEMM operands cast per GEMM "
       "(16 B/param; Loom's engine)"},
      {RecipeKind::kLoomFp8Cast, "loom-fp8-cast", ComputeDtype::kFp8, 4, 4, 0, 0, 8, 4, 4,
       "fp32 weights, gradients, activations and Adam, linear GEMMs' operands quantized to e4m3 "
       "per GEMM (16 B/param; Loom's engine)"},
  };
}

}  // namespace

const std::vector<PrecisionRecipe>& AllRecipes() {
  static const std::vector<PrecisionRecipe>* table = new std::vector<PrecisionRecipe>(BuildTable());
  return *table;
}

const PrecisionRecipe& Recipe(RecipeKind kind) {
  // The table lists every RecipeKind in the enum's order (checked by
  // tests/planner/plan_request_test.cc): a recipe is its row.
  return AllRecipes()[static_cast<size_t>(kind)];
}

RecipeKind RecipeForPrecision(spec::Precision precision) {
  return spec::RecipeOf(precision).memory;
}

}  // namespace loom::planner
