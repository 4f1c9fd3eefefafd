// Export of a Loom checkpoint to the Hugging Face LlamaForCausalLM layout:
// config.json and one model.safetensors (F32) with the HF parameter names.
// Loom already names and shapes parameters the HF way, so export gathers the
// "model" group of a checkpoint, checks it is complete, and rewrites it.
// A library of its own (loom_hf_export): it reads checkpoints through the
// engine's checkpoint files (worker/engine/checkpoint, loom_checkpoint_files),
// never the training engine, so `loomctl export` links no model or kernels.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"
#include "nlohmann/json.hpp"

namespace loom::hf_export {

// checkpoint_dir: one step directory, or a checkpoint root (its newest
// committed step is used). The checkpoint is fully verified first (every
// field bounded, worker/engine/checkpoint/checkpoint_checks.h), and a bad one is an error
// with nothing written. The files are written whole in a temporary sibling
// of out_dir and renamed into place: out_dir is created if absent, otherwise
// its config.json and model.safetensors are replaced (never followed).
absl::Status ExportHuggingFace(const std::string& checkpoint_dir, const std::string& out_dir);

// The HF names in file order: embed_tokens, per layer input_layernorm,
// self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj,
// then model.norm and lm_head (left out when embeddings are tied, as HF does).
std::vector<std::string> HuggingFaceParameterNames(const spec::ModelSpec& model);

// The config.json object for a model.
nlohmann::json HuggingFaceConfig(const spec::ModelSpec& model);

// The config.json keys every Llama-family architecture Loom exports shares
// (attention, RoPE, norm, vocabulary); HuggingFaceConfig and the MoE
// exporter's HuggingFaceMoeConfig add their own.
nlohmann::json LlamaFamilyConfig(const spec::ModelSpec& model);

}  // namespace loom::hf_export
