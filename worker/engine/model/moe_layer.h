// A mixture-of-experts FFN (docs/moe.md): the part of a decoder block after
// post_attention_layernorm when model.moe makes the layer sparse. Router,
// top-k selection, experts computed on tokens GROUPED BY EXPERT, shared
// experts, weighted combine; backward with the router gradient and the
// auxiliary load-balancing loss. Internal to the model.
//
// The seam with expert parallelism is ExpertExchange: the layer routes its
// own tokens and lays their rows out in "permuted" order (sorted by global
// expert, each expert's rows in token order); an exchange turns that into the
// rows THIS rank's experts compute, grouped by local expert, and back. On one
// process it is the identity (LocalExpertExchange below); over an EP group of
// n ranks (worker/engine/expert_parallel/) it is the all-to-all dispatch and
// combine. The layer never knows which one it has.
//
// Which experts a rank holds: with an EP group of n ranks, rank r holds the
// contiguous range [r * E / n, (r + 1) * E / n) of the E routed experts (n
// divides E). The router (mlp.gate.weight), the selection bias and the shared
// experts are replicated on every rank.
//
// Weight layout (ParameterLayout, parameter_layout.h), per MoE layer i, in
// this order inside the model's flat array:
//   model.layers.i.mlp.gate.weight                  [E, hidden]   router
//   model.layers.i.mlp.experts.e.gate_proj.weight   [F, hidden]  } for each
//   model.layers.i.mlp.experts.e.up_proj.weight     [F, hidden]  } held expert e,
//   model.layers.i.mlp.experts.e.down_proj.weight   [hidden, F]  } ascending
//   model.layers.i.mlp.shared_experts.{gate,up,down}_proj.weight  (when
//     num_shared_experts > 0: one SwiGLU of width S * F, DeepSeek-V3's form)
// so expert e's gate and up are one [2F, hidden] matrix (one GEMM) and the
// held experts are contiguous with a stride of 3 * F * hidden floats:
// MoeWeights::experts points at the first held expert's gate_proj. The
// selection bias (DeepSeek-V3's e_score_correction_bias, [E]) is not a
// trained parameter: it is model state updated from the expert load after
// each step (UpdateSelectionBias in moe_router.h), kept on the host.
//
// Today ParameterLayout holds every expert (one process, and DP); an EP
// layout holds only its range, with the same names, and installs its exchange
// with LlamaModel::SetExpertExchange. Under EP each rank routes its own
// sequences (dp x ep ranks train on different data: spec::Layout::
// data_replicas), so expert gradients reduce over dp and dense ones over
// dp x ep; the aux loss and the statistics are per rank as under DP.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/ops.h"

namespace loom::engine {

enum class RouterScore { kSoftmax, kSigmoid };

struct MoeDims {
  int64_t tokens = 0;       // rows of this rank's micro-batch (batch * seq)
  int64_t hidden = 0;
  int64_t num_experts = 0;  // E, routed experts of the whole model
  int64_t top_k = 1;
  int64_t expert_ffn = 0;   // F, one expert's SwiGLU width
  int64_t shared_ffn = 0;   // S * F; 0: no shared experts
  RouterScore score = RouterScore::kSoftmax;
  double aux_loss_coef = 0.0;
  // Routed rows an expert accepts per micro-batch; 0: dropless.
  // ceil(capacity_factor * tokens * top_k / E) when model.moe.capacity_factor is set.
  int64_t capacity = 0;
};

// One micro-batch's routing decision for this rank's tokens, on the host
// (Route in moe_router.h; the layer routes on the backend with the same
// arithmetic, kernels::Ops::MoeRoute). Assignment a = t * top_k + j is token
// t's j-th choice (j by descending selection score).
struct MoeRouting {
  std::vector<int32_t> expert;  // [tokens * top_k], global expert id
  std::vector<float> weight;    // [tokens * top_k], renormalized gate weight
  std::vector<float> scores;    // [tokens, E], softmax or sigmoid of the router logits
  std::vector<float> probs;     // [tokens, E], scores normalized per token (the aux loss's P)
  // Permuted order: the KEPT assignments sorted by expert, each expert's in
  // assignment order. row_of[a] = its row in permuted order, -1 if dropped
  // by the capacity; assignment_of[row] the inverse.
  std::vector<int32_t> row_of;
  std::vector<int32_t> assignment_of;
  std::vector<int64_t> counts;   // [E] kept rows per expert (permuted order's segments)
  std::vector<int64_t> routed;   // [E] assignments per expert before the capacity drop
  int64_t dropped = 0;           // assignments dropped by the capacity
  int64_t kept_rows() const { return static_cast<int64_t>(assignment_of.size()); }
};

// What the exchange needs to move one micro-batch's rows, computed once per
// routing (Plan) and reused by every Dispatch/Combine of that micro-batch,
// forward and backward.
struct ExchangePlan {
  std::vector<int64_t> send_counts;   // [E] this rank's permuted rows per global expert
  std::vector<int64_t> local_counts;  // [held experts] rows each held expert computes
  int64_t grouped_rows = 0;           // sum of local_counts
  // Free for the implementation (e.g. per-source-rank splits over EP).
  std::vector<int64_t> detail;
};
// The layer sizes its grouped buffers from plan.grouped_rows after Plan (under
// EP a rank may compute more rows than it routes).

// Moves token rows between the ranks that route them and the ranks that hold
// their experts. Rows have `width` floats and are backend memory.
//   Dispatch: permuted rows of this rank (send_counts[e] rows per global
//     expert e, in expert order) -> the rows this rank's held experts compute,
//     grouped by held expert (local_counts[i] rows for held expert i, in
//     ascending source rank, each source's rows in its permuted order).
//   Combine: exactly the inverse movement (grouped -> permuted).
// The backward of Dispatch is Combine of the gradients, and the backward of
// Combine is Dispatch of the gradients, with the same plan: the layer calls
// them that way (DispatchBackward / CombineBackward below say so by name).
// Every call is collective over the EP group: every rank calls Plan, then the
// same sequence of Dispatch/Combine, per MoE layer and micro-batch.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int64_t first_expert() const = 0;  // first held expert
  virtual int64_t num_held() const = 0;      // held experts (E / ep)
  virtual absl::Status Plan(const std::vector<int64_t>& send_counts, ExchangePlan* plan) = 0;
  virtual absl::Status Dispatch(const ExchangePlan& plan, const float* permuted, int64_t width,
                                float* grouped) = 0;
  virtual absl::Status Combine(const ExchangePlan& plan, const float* grouped, int64_t width,
                               float* permuted) = 0;

  absl::Status DispatchBackward(const ExchangePlan& plan, const float* d_grouped, int64_t width,
                                float* d_permuted) {
    return Combine(plan, d_grouped, width, d_permuted);
  }
  absl::Status CombineBackward(const ExchangePlan& plan, const float* d_permuted, int64_t width,
                               float* d_grouped) {
    return Dispatch(plan, d_permuted, width, d_grouped);
  }
};

// One process holds every expert: the grouped rows ARE the permuted rows.
class LocalExpertExchange final : public ExpertExchange {
 public:
  LocalExpertExchange(kernels::Ops* ops, int64_t num_experts) : ops_(ops), experts_(num_experts) {}
  int64_t first_expert() const override { return 0; }
  int64_t num_held() const override { return experts_; }
  absl::Status Plan(const std::vector<int64_t>& send_counts, ExchangePlan* plan) override;
  absl::Status Dispatch(const ExchangePlan& plan, const float* permuted, int64_t width,
                        float* grouped) override;
  absl::Status Combine(const ExchangePlan& plan, const float* grouped, int64_t width,
                       float* permuted) override;

 private:
  kernels::Ops* ops_;
  int64_t experts_;
};

struct MoeWeights {
  const float* router;          // [E, hidden]
  const float* bias = nullptr;  // [E] host, selection only; null: no bias
  const float* experts;         // held experts, stride 3 * F * hidden (see above)
  const float* shared_gate_up = nullptr;  // [2 S F, hidden]
  const float* shared_down = nullptr;     // [hidden, S F]
};

struct MoeGrads {
  float* router;
  float* experts;
  float* shared_gate_up = nullptr;
  float* shared_down = nullptr;
};

// The host's part of the forward's saved state of one MoE layer and
// micro-batch: the per-expert counts that size the expert GEMMs and the
// exchange (copied from the backend once per forward, with the aux loss's
// column sums). The routing itself (choices, weights, scores, the permuted
// order) stays in backend memory, in the layer.
struct MoeActivations {
  std::vector<int64_t> counts;  // [E] kept rows per expert (the permuted order's segments)
  std::vector<int64_t> routed;  // [E] assignments per expert before the capacity drop
  int64_t assignments = 0;      // tokens * top_k
  int64_t dropped = 0;          // assignments dropped by the capacity
  int64_t kept_rows = 0;
  ExchangePlan plan;
  double aux_loss = 0.0;  // coef * E * sum_e f_e * P_e of this micro-batch
};

// Per-step expert statistics of one rank (summed over its micro-batches and
// MoE layers; the training loop sums them over data parallelism).
struct MoeStepStats {
  std::vector<double> tokens_per_expert;  // [moe layers * E] routed assignments
  double dropped = 0;                     // dropped assignments
  double assignments = 0;                 // all assignments (tokens * top_k)
  double aux_loss = 0;                    // sum over micro-batches and layers of aux_loss
  int64_t micro_batches = 0;
};

// Backend scratch of the backward passes, shared by every MoE layer of a model.
struct MoeScratch {
  kernels::Buffer d_permuted, d_grouped, d_act, d_gu, d_grouped_in, d_permuted_in, d_logits;
  kernels::Buffer d_shared_act, d_shared_gu;
  kernels::Buffer d_weight;  // [tokens * top_k] the gate weights' gradient
};

// One MoE layer's forward and backward on caller-owned weights; it owns the
// activations its backward needs (sized on demand), so each MoE layer of a
// model has its own MoeLayer. Calls go through `ops` and `exchange` (neither
// owned). A failed exchange makes the call return its status; the layer's
// outputs are then meaningless.
class MoeLayer {
 public:
  MoeLayer(kernels::Ops* ops, ExpertExchange* exchange) : ops_(ops), exchange_(exchange) {}
  // h2 [tokens, hidden] is the layer's normed input; x_next = x_mid + the
  // layer's output (routed and shared experts), unless x_next is null (a
  // recompute: only the activations are rebuilt).
  absl::Status Forward(const MoeDims& d, const MoeWeights& w, const float* h2, const float* x_mid,
                       float* x_next);
  // dy [tokens, hidden] is d(objective)/d(x_next); dh (overwritten) receives
  // d(objective)/d(h2). Weight gradients accumulate into g; the aux loss
  // enters with weight `loss_scale` (as the micro-batch's loss does).
  absl::Status Backward(const MoeDims& d, const MoeWeights& w, const MoeGrads& g, const float* h2,
                        const float* dy, double loss_scale, MoeScratch& s, float* dh);
  const MoeActivations& activations() const { return acts_; }
  // Adds the last forward's routing to `stats`, its loads at `slot` * E.
  void AddStats(int64_t slot, MoeStepStats* stats) const;
  int64_t ActivationBytes() const;

 private:
  float* Ensure(kernels::Buffer& b, int64_t floats);
  // Routes the logits on the backend (Ops::MoeRoute) into the routing
  // buffers below and copies the counts and the aux loss's sums to acts_.
  void RouteOnBackend(const MoeDims& d, const float* bias, const float* logits);
  kernels::Ops* ops_;
  ExpertExchange* exchange_;
  MoeActivations acts_;
  kernels::Buffer logits_, permuted_, grouped_in_, gu_, act_, grouped_out_, permuted_out_;
  kernels::Buffer shared_gu_, shared_act_;
  // The routing in backend memory (kernels::Ops::MoeRoute's outputs), and the
  // selection bias's copy there.
  kernels::Buffer expert_, weight_, scores_, probs_, row_of_, assignment_of_, counts_, prob_sum_,
      bias_;
};


}  // namespace loom::engine
