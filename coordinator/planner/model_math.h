// Model arithmetic for the planner: the exact parameter count of a decoder
// (Llama: GQA, RMSNorm, SwiGLU, tied or untied embeddings; GPT-2/Megatron:
// LayerNorm, GELU MLP, biases, learned positions) and FLOPs per token. The
// counts are what every memory and time estimate is built on.
#pragma once

#include <cstdint>
#include <string>

#include "common/spec/job_spec.h"

namespace loom::planner {

// A decoder's shape, as the planner needs it. Llama by default; the flags
// describe the GPT variant that Megatron-LM trains (used for held-out checks).
struct ModelShape {
  std::string name;
  int64_t vocab_size = 256;
  int64_t hidden_size = 128;
  int64_t num_layers = 4;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 4;
  int64_t ffn_hidden_size = 384;
  bool tie_embeddings = false;
  bool gated_mlp = true;          // SwiGLU: gate, up and down matrices
  bool linear_bias = false;       // GPT: every linear layer has a bias
  bool layer_norm = false;        // GPT: LayerNorm (weight and bias), else RMSNorm
  int64_t learned_positions = 0;  // GPT: rows of the position-embedding table
  // The attention core runs as one fused kernel (flash attention) that keeps
  // no score matrix; false: the scores are materialized and pass through
  // HBM (scale/mask/softmax, dropout, the second batched GEMM), as in
  // Megatron-LM's classic GPT path.
  bool fused_attention = true;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t kv_dim() const { return num_kv_heads * head_dim(); }
};

// The Llama shape of a job spec (num_kv_heads 0 means "same as num_heads").
ModelShape ModelShapeFromSpec(const spec::ModelSpec& model, const std::string& name = "");

struct ParamCount {
  int64_t embedding = 0;           // token embedding table
  int64_t position_embedding = 0;  // learned positions (GPT), replicated across TP
  int64_t lm_head = 0;             // 0 when tied to the embedding
  int64_t layer_linear = 0;        // per layer, the weights (and biases) TP shards
  int64_t layer_replicated = 0;    // per layer, the norms TP replicates
  int64_t final_norm = 0;
  int64_t total = 0;

  int64_t per_layer() const { return layer_linear + layer_replicated; }
};

ParamCount CountParams(const ModelShape& model);

// Model FLOPs per token of one training step (forward and backward):
// 6·N for the matrix multiplies plus 12·L·h·s for attention scores and values,
// N the total parameter count. This is the numerator of MFU.
double ModelFlopsPerToken(const ModelShape& model, int64_t seq_len);

// Hardware FLOPs per token: what the device really executes, counting the
// forward pass that recompute repeats (full: everything, 8·N + 16·L·h·s;
// selective: the attention core only, 6·N + 16·L·h·s). Numerator of HFU.
double HardwareFlopsPerToken(const ModelShape& model, int64_t seq_len, spec::Recompute recompute);

}  // namespace loom::planner
