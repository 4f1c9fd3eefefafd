// The Llama decoder on one rank: parameters, gradients, and an explicit
// forward and backward built from the kernels/ ops API. Parameters use the
// Hugging Face LlamaForCausalLM names and shapes so that checkpoints and export
// need no renaming.
//
// Numerics: fp32; same inputs and thread count give bit-identical loss and
// gradients, and the three recompute modes give bit-identical gradients.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/spec/job_spec.h"
#include "kernels/ops.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

class LlamaModel {
 public:
  // `ops` is the backend every op and buffer goes through; null means a CPU
  // backend with OpenMP's default thread count. Parameters() and Gradients()
  // hand out backend memory, which is host memory for the CPU backend.
  // config.num_kv_heads must be resolved (> 0 and dividing num_heads) and
  // head_dim() even.
  LlamaModel(const spec::ModelSpec& config, spec::Recompute recompute,
             std::shared_ptr<kernels::Ops> ops = nullptr);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // Deterministic initialization from the seed alone (same seed, same weights):
  // normal(0, 0.02) for embeddings and projections, except o_proj and
  // down_proj at 0.02 / sqrt(2 * num_layers); ones for norm weights. Own RNG
  // (SplitMix64 + Box-Muller), one stream per tensor.
  void InitParameters(uint64_t seed);

  // Fixed order: embed_tokens, then each layer's input_layernorm, q,k,v,o_proj,
  // post_attention_layernorm, gate,up,down_proj, then model.norm, then lm_head
  // (absent when embeddings are tied). All views point into one contiguous
  // array in this order.
  std::vector<TensorView> Parameters();
  // Same order, names and shapes as Parameters().
  std::vector<TensorView> Gradients();
  void ZeroGradients();
  int64_t NumParameters() const;

  // One micro-batch: inputs and targets are [batch, seq] host token ids. Returns
  // the mean cross-entropy over the batch*seq targets and ADDS loss_scale * d(mean
  // loss)/d(param) into the gradients (so accumulation over micro-batches works
  // by passing 1/num_micro_batches). A negative target is ignored (neither in
  // the mean nor the gradient). Token ids outside [0, vocab_size) abort.
  float ForwardBackward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                        float loss_scale);
  // Mean cross-entropy only (evaluation); touches no gradient.
  float ForwardLoss(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq);

  const spec::ModelSpec& config() const { return config_; }
  spec::Recompute recompute() const { return recompute_; }
  kernels::Ops& ops() { return *ops_; }

 private:
  struct Impl;
  spec::ModelSpec config_;
  spec::Recompute recompute_;
  std::shared_ptr<kernels::Ops> ops_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::engine
