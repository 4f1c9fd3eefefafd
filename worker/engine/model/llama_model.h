// The Llama decoder on one rank: parameters, gradients, and an explicit
// forward and backward built from the kernels/ ops API. Parameters use the
// Hugging Face LlamaForCausalLM names and shapes so that checkpoints and export
// need no renaming.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/spec/job_spec.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

class LlamaModel {
 public:
  LlamaModel(const spec::ModelSpec& config, spec::Recompute recompute);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // Deterministic initialization from the seed alone (same seed, same weights).
  void InitParameters(uint64_t seed);

  // Fixed order: embed_tokens, then each layer's input_layernorm, q,k,v,o_proj,
  // post_attention_layernorm, gate,up,down_proj, then model.norm, then lm_head
  // (absent when embeddings are tied).
  std::vector<TensorView> Parameters();
  // Same order, names and shapes as Parameters().
  std::vector<TensorView> Gradients();
  void ZeroGradients();
  int64_t NumParameters() const;

  // One micro-batch: inputs and targets are [batch, seq] token ids. Returns the
  // mean cross-entropy over the batch*seq targets and ADDS loss_scale * d(mean
  // loss)/d(param) into the gradients (so accumulation over micro-batches works
  // by passing 1/num_micro_batches).
  float ForwardBackward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                        float loss_scale);
  // Mean cross-entropy only (evaluation); touches no gradient.
  float ForwardLoss(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq);

  const spec::ModelSpec& config() const { return config_; }

 private:
  struct Impl;
  spec::ModelSpec config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::engine
