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
  // [moe] Mixture of experts (model.moe): layers [first_dense_layers, L) have
  // a router [E, h], E routed SwiGLU experts of width expert_ffn (top_k of
  // them per token) and shared experts of total width shared_ffn instead of
  // the dense MLP. num_experts 0: dense.
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t expert_ffn = 0;
  int64_t shared_ffn = 0;
  int64_t first_dense_layers = 0;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t kv_dim() const { return num_kv_heads * head_dim(); }
  int64_t moe_layers() const { return num_experts > 0 ? num_layers - first_dense_layers : 0; }
  // The MLP width one token activates, averaged over the layers (the dense
  // FFN, or top_k experts plus the shared ones): activations and traffic.
  double ActiveFfnWidth() const {
    if (num_layers <= 0) return 0;
    const double moe = static_cast<double>(moe_layers());
    return ((num_layers - moe) * ffn_hidden_size + moe * (top_k * expert_ffn + shared_ffn)) /
           static_cast<double>(num_layers);
  }
};

// The Llama shape of a job spec (num_kv_heads 0 means "same as num_heads").
ModelShape ModelShapeFromSpec(const spec::ModelSpec& model, const std::string& name = "");

struct ParamCount {
  int64_t embedding = 0;           // token embedding table
  int64_t position_embedding = 0;  // learned positions (GPT), replicated across TP
  int64_t lm_head = 0;             // 0 when tied to the embedding
  // Per layer, the weights (and biases) TP shards; with experts, the mean over
  // the layers of all but the routed experts (attention, the dense MLP or the
  // router and shared experts).
  int64_t layer_linear = 0;
  int64_t layer_replicated = 0;    // per layer, the norms TP replicates
  int64_t final_norm = 0;
  // [moe] The routed experts' weights of the whole model (sharded over ep and
  // tp), and the parameters one token uses (the top_k experts of E): MFU's N.
  int64_t experts = 0;
  int64_t active = 0;
  int64_t total = 0;

  int64_t per_layer() const { return layer_linear + layer_replicated; }
};

ParamCount CountParams(const ModelShape& model);

// Model FLOPs per token of one training step (forward and backward):
// 6·N for the matrix multiplies plus 12·L·h·s for attention scores and values,
// N the parameter count a token uses (all of them for a dense model; top_k of
// the routed experts for an MoE). This is the numerator of MFU.
double ModelFlopsPerToken(const ModelShape& model, int64_t seq_len);

// Hardware FLOPs per token: what the device really executes, counting the
// forward pass that recompute repeats (full: everything, 8·N + 16·L·h·s;
// selective: the attention core only, 6·N + 16·L·h·s). Numerator of HFU.
double HardwareFlopsPerToken(const ModelShape& model, int64_t seq_len, spec::Recompute recompute);

}  // namespace loom::planner
