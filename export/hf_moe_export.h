// [moe] The Hugging Face layouts of a mixture-of-experts model (docs/moe.md):
// Mixtral's (MixtralForCausalLM) when every layer is MoE without shared
// experts, Qwen2-MoE's (Qwen2MoeForCausalLM) when there are shared experts or
// dense first layers. Both route as Loom's softmax router does (softmax over
// every expert, top-k, weights renormalized). What the HF layouts have and
// Loom does not is filled so the function is the same: Qwen2-MoE's q/k/v
// biases are zeros, its shared-expert gate is zeros (sigmoid(0) = 1/2) with
// the shared down_proj doubled, and without shared experts a zero shared
// expert of width 1.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "nlohmann/json.hpp"

namespace loom::hf_export {

// One tensor of the exported file: read loom_name from the checkpoint and
// multiply by `scale`, or (loom_name empty) zeros of `shape`.
struct HfTensorSource {
  std::string hf_name;
  std::string loom_name;
  std::vector<int64_t> shape;  // for zeros only
  float scale = 1.0f;
};

// FAILED_PRECONDITION naming the field when the model has no HF layout that
// computes what Loom computes (sigmoid scores, the selection bias).
absl::Status CheckMoeExportable(const spec::ModelSpec& model);
// The tensors in file order, and config.json, of an exportable MoE model.
std::vector<HfTensorSource> HuggingFaceMoeTensors(const spec::ModelSpec& model);
nlohmann::json HuggingFaceMoeConfig(const spec::ModelSpec& model);

}  // namespace loom::hf_export
