// The Llama decoder on one rank: parameters, gradients, and an explicit
// forward and backward built from the kernels/ ops API. Parameters use the
// Hugging Face LlamaForCausalLM names and shapes so that checkpoints and export
// need no renaming.
//
// Numerics: fp32; same inputs and thread count give bit-identical loss and
// gradients, and the three recompute modes give bit-identical gradients.
//
// Tensor parallelism (docs/tensor_parallel.md): constructed with a TP group
// of n > 1 ranks, each rank holds its shards (its query/kv heads, FFN columns,
// vocabulary rows) and every rank of the group runs ForwardBackward on the
// SAME micro-batch; loss and gradients equal one process's up to the order of
// float additions. Parameters()/Gradients() are then the local shards, each
// view saying where it sits in the global tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"

#include "common/spec/job_spec.h"
#include "kernels/ops.h"
#include "worker/comm/communicator.h"
#include "worker/engine/model/moe_layer.h"
#include "worker/engine/model/parameter_layout.h"
#include "worker/engine/tensor_parallel/tp_plan.h"
#include "worker/engine/tensor_view.h"

namespace loom::engine {

// Callbacks for the data-parallel engine (worker/engine/zero): bucketed
// gradient reduction launched during backward and ZeRO-3 parameter gathering.
// Units: 0 = model.embed_tokens, 1 + l = decoder layer l, num_layers + 1 =
// model.norm and lm_head (which is embed_tokens when tied). Every method
// defaults to doing nothing, which is the behaviour without hooks.
class ModelHooks {
 public:
  virtual ~ModelHooks() = default;
  // Bracket every read of the unit's parameters in a forward (backward ==
  // false) or backward pass; ZeRO-3 gathers the unit in BeforeUse.
  virtual void BeforeUse(int64_t unit, bool backward) {}
  virtual void AfterUse(int64_t unit, bool backward) {}
  // Backward has added the last gradient of this micro-batch into the unit's
  // tensors (a tied lm_head's gradient counts for unit 0).
  virtual void GradientsReady(int64_t unit) {}
};

// How the model is spread over a tensor-parallel group.
struct TensorParallelOptions {
  // The TP group (not owned; must outlive the model). nullptr or a group of
  // one: the whole model on this rank, bit-identical to no TP at all.
  comm::Communicator* tp = nullptr;
  // Megatron sequence parallelism: norms and the residual stream split by
  // token rows (batch * seq must then divide by the TP size).
  bool sequence_parallel = false;
  // Context parallelism (docs/context_parallel.md): the CP group (not owned),
  // null or a group of one for none. Each rank then passes only its zigzag
  // chunks of every sequence (LocalTokens in context_parallel/zigzag.h, seq =
  // its local length, 2 chunks); attention is the ring over the group, the
  // loss the mean over the whole sequence (identical on every CP rank), and
  // the gradients are this rank's share: their sum over the group is one
  // process's gradient (the data-parallel engine reduces over DP x CP).
  comm::Communicator* cp = nullptr;
};

class LlamaModel {
 public:
  // `ops` is the backend every op and buffer goes through: the rank's
  // (MakeOpsForJob, ops_selection.h, is the one place that chooses it); the
  // constructor aborts without one. Parameters() and Gradients() hand out
  // backend memory, which is host memory for the CPU backend.
  // config.num_kv_heads must be resolved (> 0 and dividing num_heads) and
  // head_dim() even. With a TP group the config must pass
  // CheckTensorParallel(config, tp size) (tp_plan.h); the constructor aborts
  // otherwise.
  //
  // [pp] `part` restricts the model to one pipeline chunk (parameter_layout.h):
  // its layers, and the embedding and/or the head. Parameters() then lists
  // only those tensors (global names, the whole model's init streams); the
  // part must pass CheckModelPart (the constructor aborts otherwise).
  LlamaModel(const spec::ModelSpec& config, spec::Recompute recompute,
             std::shared_ptr<kernels::Ops> ops, TensorParallelOptions parallel = {},
             ModelPart part = {});
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // Deterministic initialization from the seed alone (same seed, same weights):
  // normal(0, 0.02) for embeddings and projections, except o_proj and
  // down_proj at 0.02 / sqrt(2 * num_layers); ones for norm weights. Own RNG
  // (SplitMix64 + Box-Muller), one stream per tensor. Under TP each rank
  // keeps its slice of the global tensor, so the shards assemble to the
  // weights one process would have.
  void InitParameters(uint64_t seed);

  // Fixed order: embed_tokens, then each layer's input_layernorm, q,k,v,o_proj,
  // post_attention_layernorm, gate,up,down_proj, then model.norm, then lm_head
  // (absent when embeddings are tied). All views point into one contiguous
  // array in this order. Under TP: this rank's shards, same names, with
  // global_shape / shard_axis / shard_offset / replicas filled in.
  std::vector<TensorView> Parameters();
  // Same order, names and shapes as Parameters().
  std::vector<TensorView> Gradients();
  void ZeroGradients();
  // Floats this rank holds (its shards under TP).
  int64_t NumParameters() const;
  // Parameters of the whole model (what one process holds).
  int64_t NumGlobalParameters() const;

  // One micro-batch: inputs and targets are [batch, seq] host token ids. Returns
  // the mean cross-entropy over the batch*seq targets and ADDS loss_scale * d(mean
  // loss)/d(param) into the gradients (so accumulation over micro-batches works
  // by passing 1/num_micro_batches). A negative target is ignored (neither in
  // the mean nor the gradient). Token ids outside [0, vocab_size) abort.
  // Under TP the call is collective over the group, and the gradients of
  // replicated tensors are summed over it before this returns. If a TP
  // collective fails (or batch * seq does not divide under SP) the result is
  // NaN and status() says why.
  float ForwardBackward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                        float loss_scale);
  // Mean cross-entropy only (evaluation); touches no gradient.
  float ForwardLoss(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq);
  // The outcome of the last ForwardBackward / ForwardLoss: OK, or why its
  // result is meaningless (the failed TP collective, naming group and op).
  const absl::Status& status() const;

  // ---- [pp] One pipeline part (docs/pipeline.md) ----
  // A part without the embedding reads its input activation `x` (the residual
  // stream entering its first layer, PartActivationFloats floats) instead of
  // token ids; a part without the head writes its output activation to `y`.
  // x, y, dy and dx are BACKEND memory (ops().Allocate: device memory on a
  // GPU, so the pipeline sends and receives them without a host copy);
  // `inputs` and `targets` are host token ids, needed only with the
  // embedding and the head respectively.
  //
  // Forward only, for a part without the head: y = the part's output.
  void PartForward(const int32_t* inputs, const float* x, int64_t batch, int64_t seq, float* y);
  // Forward (replayed from the same input) and backward of the part. With the
  // head: the loss of `targets` as in ForwardBackward (returned), dy unused;
  // without: dy is d(loss)/d(output) (already scaled). Gradients are ADDED.
  // Without the embedding dx receives d(loss)/d(x). Returns 0 without the head.
  float PartForwardBackward(const int32_t* inputs, const float* x, const int32_t* targets,
                            const float* dy, int64_t batch, int64_t seq, float loss_scale,
                            float* dx);
  // Mean cross-entropy of a part with the head (evaluation); no gradient.
  float PartForwardLoss(const int32_t* inputs, const float* x, const int32_t* targets,
                        int64_t batch, int64_t seq);
  // Floats of one activation crossing a part boundary on this rank: rows x
  // hidden, rows = batch * seq (divided by the TP size under SP).
  int64_t PartActivationFloats(int64_t batch, int64_t seq) const;
  const ModelPart& part() const;

  // This rank's cut of the model (size 1 without TP).
  const TpPlan& tp_plan() const;

  // [cp] Attention FLOPs this rank's ring computed so far (zero without CP):
  // the counter behind the zigzag's load balance (docs/context_parallel.md).
  int64_t ContextParallelAttentionFlops() const;

  // ---- [moe] Mixture-of-experts layers (model.moe; docs/moe.md) ----
  // ForwardBackward returns the cross-entropy alone; each MoE layer's aux
  // loss enters the gradients (weighted by loss_scale) and the statistics.
  // The routing statistics of every ForwardBackward since the last call
  // (tokens per expert of each held MoE layer, in layer order), then reset.
  MoeStepStats TakeMoeStats();
  // DeepSeek-V3's auxiliary-loss-free update (model.moe.bias_update_rate > 0)
  // from a step's tokens per expert as TakeMoeStats lays them out, summed
  // over the data-parallel ranks (so every replica moves its bias the same).
  void UpdateExpertBias(const std::vector<double>& tokens_per_expert);
  // The selection bias of each held MoE layer, named
  // model.layers.L.mlp.gate.e_score_correction_bias, [E] host memory.
  std::vector<TensorView> ExpertBiases();
  // Routes the MoE layers' tokens through `exchange` (not owned) instead of
  // the one-process permutation; null restores it. [ep]
  void SetExpertExchange(ExpertExchange* exchange);

  // Installs hooks (null: none); they must outlive every later pass.
  void SetHooks(ModelHooks* hooks);
  static int64_t NumUnits(const spec::ModelSpec& config) { return config.num_layers + 2; }
  // Bytes of activation and scratch buffers allocated so far (memory accounting).
  int64_t ActivationBytes() const;

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
