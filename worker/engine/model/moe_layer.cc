#include "worker/engine/model/moe_layer.h"

#include <algorithm>

#include "worker/engine/model/moe_router.h"

namespace loom::engine {
namespace {

using kernels::Transpose;
constexpr Transpose kN = Transpose::kNo;
constexpr Transpose kT = Transpose::kYes;
constexpr int64_t kF = static_cast<int64_t>(sizeof(float));

}  // namespace

// ---- The one-process exchange: grouped rows are the permuted rows. -----------

absl::Status LocalExpertExchange::Plan(const std::vector<int64_t>& send_counts,
                                       ExchangePlan* plan) {
  plan->send_counts = send_counts;
  plan->local_counts = send_counts;
  plan->grouped_rows = 0;
  for (int64_t n : send_counts) plan->grouped_rows += n;
  plan->detail.clear();
  return absl::OkStatus();
}

absl::Status LocalExpertExchange::Dispatch(const ExchangePlan& plan, const float* permuted,
                                           int64_t width, float* grouped) {
  if (plan.grouped_rows > 0) ops_->CopyDeviceToDevice(grouped, permuted, plan.grouped_rows * width * kF);
  return absl::OkStatus();
}

absl::Status LocalExpertExchange::Combine(const ExchangePlan& plan, const float* grouped,
                                          int64_t width, float* permuted) {
  if (plan.grouped_rows > 0) ops_->CopyDeviceToDevice(permuted, grouped, plan.grouped_rows * width * kF);
  return absl::OkStatus();
}

// ---- The layer ----------------------------------------------------------------

float* MoeLayer::Ensure(kernels::Buffer& b, int64_t floats) {
  floats = std::max<int64_t>(floats, 1);
  if (b.bytes() < floats * kF) b = ops_->AllocateFloats(floats);
  return b.f32();
}

void MoeLayer::RouteOnBackend(const MoeDims& d, const float* bias, const float* logits) {
  kernels::Ops& ops = *ops_;
  const int64_t t = d.tokens, e_count = d.num_experts, assignments = d.tokens * d.top_k;
  const float* bias_dev = nullptr;
  if (bias != nullptr) {  // host model state: E floats per layer and micro-batch
    bias_dev = Ensure(bias_, e_count);
    ops.CopyHostToDevice(bias_.f32(), bias, e_count * kF);
  }
  // int32 and float are both 4 bytes; the int64 counts and the double sums take two floats each.
  ops.MoeRoute(RouteDims(d), logits, bias_dev, reinterpret_cast<int32_t*>(Ensure(expert_, assignments)),
               Ensure(weight_, assignments), Ensure(scores_, t * e_count), Ensure(probs_, t * e_count),
               reinterpret_cast<int32_t*>(Ensure(row_of_, assignments)),
               reinterpret_cast<int32_t*>(Ensure(assignment_of_, assignments)),
               reinterpret_cast<int64_t*>(Ensure(counts_, 4 * e_count)),
               reinterpret_cast<double*>(Ensure(prob_sum_, 2 * e_count)));
  // The host needs the counts (they size the expert GEMMs and the exchange)
  // and the aux loss; nothing else of the routing leaves the backend.
  std::vector<int64_t> counts(static_cast<size_t>(2 * e_count));
  std::vector<double> prob_sum(static_cast<size_t>(e_count));
  ops.CopyDeviceToHost(counts.data(), counts_.data(), 2 * e_count * 8);
  ops.CopyDeviceToHost(prob_sum.data(), prob_sum_.data(), e_count * 8);
  acts_.counts.assign(counts.begin(), counts.begin() + e_count);
  acts_.routed.assign(counts.begin() + e_count, counts.end());
  acts_.assignments = assignments;
  acts_.kept_rows = 0;
  for (int64_t n : acts_.counts) acts_.kept_rows += n;
  acts_.dropped = assignments - acts_.kept_rows;
  acts_.aux_loss = AuxLoss(d, acts_.routed.data(), prob_sum.data());
}

absl::Status MoeLayer::Forward(const MoeDims& d, const MoeWeights& w, const float* h2,
                               const float* x_mid, float* x_next) {
  kernels::Ops& ops = *ops_;
  const int64_t t = d.tokens, h = d.hidden, e_count = d.num_experts, f = d.expert_ffn;
  // The router stays in full precision (GemmScope::kDefault), as DeepSeek-V3's.
  float* logits = Ensure(logits_, t * e_count);
  ops.Gemm(kN, kT, t, e_count, h, 1.0f, h2, h, w.router, h, 0.0f, logits, e_count);
  RouteOnBackend(d, w.bias, logits);

  // Token rows into permuted order, then to the ranks holding their experts.
  const int64_t kept = acts_.kept_rows;
  float* permuted = Ensure(permuted_, kept * h);
  const int32_t* assignment_of = reinterpret_cast<const int32_t*>(assignment_of_.data());
  const int32_t* row_of = reinterpret_cast<const int32_t*>(row_of_.data());
  if (kept > 0) ops.MoePermute(kept, d.top_k, h, h2, assignment_of, nullptr, permuted);
  if (absl::Status s = exchange_->Plan(acts_.counts, &acts_.plan); !s.ok()) return s;
  const ExchangePlan& plan = acts_.plan;
  const int64_t g_rows = plan.grouped_rows;
  float* grouped_in = Ensure(grouped_in_, g_rows * h);
  if (absl::Status s = exchange_->Dispatch(plan, permuted, h, grouped_in); !s.ok()) return s;

  // Each held expert's SwiGLU on its contiguous rows.
  float* gu = Ensure(gu_, g_rows * 2 * f);
  float* act = Ensure(act_, g_rows * f);
  float* grouped_out = Ensure(grouped_out_, g_rows * h);
  {
    const kernels::GemmScopeGuard linear(ops, kernels::GemmScope::kLinear);
    int64_t first = 0;
    for (size_t i = 0; i < plan.local_counts.size(); ++i) {
      const int64_t n = plan.local_counts[i];
      if (n == 0) continue;
      const float* w_gu = w.experts + static_cast<int64_t>(i) * 3 * f * h;
      const float* w_down = w_gu + 2 * f * h;
      float* gu_i = gu + first * 2 * f;
      ops.Gemm(kN, kT, n, 2 * f, h, 1.0f, grouped_in + first * h, h, w_gu, h, 0.0f, gu_i, 2 * f);
      ops.SwiGluForward(n, f, gu_i, gu_i + f, 2 * f, act + first * f, f);
      ops.Gemm(kN, kT, n, h, f, 1.0f, act + first * f, f, w_down, f, 0.0f, grouped_out + first * h, h);
      first += n;
    }
    // Shared experts: one dense SwiGLU over every token.
    if (d.shared_ffn > 0) {
      const int64_t sf = d.shared_ffn;
      float* sgu = Ensure(shared_gu_, t * 2 * sf);
      float* sact = Ensure(shared_act_, t * sf);
      ops.Gemm(kN, kT, t, 2 * sf, h, 1.0f, h2, h, w.shared_gate_up, h, 0.0f, sgu, 2 * sf);
      ops.SwiGluForward(t, sf, sgu, sgu + sf, 2 * sf, sact, sf);
      if (x_next != nullptr) {
        ops.CopyDeviceToDevice(x_next, x_mid, t * h * kF);
        ops.Gemm(kN, kT, t, h, sf, 1.0f, sact, sf, w.shared_down, sf, 1.0f, x_next, h);
      }
    } else if (x_next != nullptr) {
      ops.CopyDeviceToDevice(x_next, x_mid, t * h * kF);
    }
  }
  float* permuted_out = Ensure(permuted_out_, kept * h);
  if (absl::Status s = exchange_->Combine(plan, grouped_out, h, permuted_out); !s.ok()) return s;
  if (x_next == nullptr) return absl::OkStatus();
  // Weighted combine, token by token, choices in order (a fixed order of additions).
  ops.MoeUnpermute(t, d.top_k, h, permuted_out, row_of, weight_.f32(), x_next);
  return absl::OkStatus();
}

absl::Status MoeLayer::Backward(const MoeDims& d, const MoeWeights& w, const MoeGrads& g,
                                const float* h2, const float* dy, double loss_scale,
                                MoeScratch& s, float* dh) {
  kernels::Ops& ops = *ops_;
  const int64_t t = d.tokens, h = d.hidden, e_count = d.num_experts, f = d.expert_ffn, k = d.top_k;
  const ExchangePlan& plan = acts_.plan;
  const int64_t kept = acts_.kept_rows, g_rows = plan.grouped_rows;
  const int32_t* row_of = reinterpret_cast<const int32_t*>(row_of_.data());
  const int32_t* assignment_of = reinterpret_cast<const int32_t*>(assignment_of_.data());
  const kernels::GemmScopeGuard linear(ops, kernels::GemmScope::kLinear);
  // Shared experts (the dense MLP's backward); their input gradient starts dh.
  if (d.shared_ffn > 0) {
    const int64_t sf = d.shared_ffn;
    float* d_sact = Ensure(s.d_shared_act, t * sf);
    float* d_sgu = Ensure(s.d_shared_gu, t * 2 * sf);
    ops.Gemm(kT, kN, h, sf, t, 1.0f, dy, h, shared_act_.f32(), sf, 1.0f, g.shared_down, sf);
    ops.Gemm(kN, kN, t, sf, h, 1.0f, dy, h, w.shared_down, sf, 0.0f, d_sact, sf);
    ops.SwiGluBackward(t, sf, shared_gu_.f32(), shared_gu_.f32() + sf, 2 * sf, d_sact, sf, d_sgu,
                       d_sgu + sf);
    ops.Gemm(kT, kN, 2 * sf, h, t, 1.0f, d_sgu, 2 * sf, h2, h, 1.0f, g.shared_gate_up, h);
    ops.Gemm(kN, kN, t, h, 2 * sf, 1.0f, d_sgu, 2 * sf, w.shared_gate_up, h, 0.0f, dh, h);
  } else {
    ops.Fill(dh, t * h, 0.0f);
  }

  // The gate weights' gradient: d weight[a] = dy[token] . expert output[a].
  float* d_weight = Ensure(s.d_weight, t * k);
  ops.MoeGateGrad(t, k, h, dy, permuted_out_.f32(), row_of, d_weight);

  // The expert outputs' gradient, weight * dy[token], in permuted order, to the experts.
  float* d_permuted = Ensure(s.d_permuted, kept * h);
  if (kept > 0) ops.MoePermute(kept, k, h, dy, assignment_of, weight_.f32(), d_permuted);
  float* d_grouped = Ensure(s.d_grouped, g_rows * h);
  if (absl::Status st = exchange_->CombineBackward(plan, d_permuted, h, d_grouped); !st.ok()) {
    return st;
  }
  float* d_act = Ensure(s.d_act, g_rows * f);
  float* d_gu = Ensure(s.d_gu, g_rows * 2 * f);
  float* d_grouped_in = Ensure(s.d_grouped_in, g_rows * h);
  int64_t first = 0;
  for (size_t i = 0; i < plan.local_counts.size(); ++i) {
    const int64_t n = plan.local_counts[i];
    if (n == 0) continue;
    const int64_t offset = static_cast<int64_t>(i) * 3 * f * h;
    const float* w_gu = w.experts + offset;
    const float* w_down = w_gu + 2 * f * h;
    float* g_gu = g.experts + offset;
    float* g_down = g_gu + 2 * f * h;
    const float* dy_i = d_grouped + first * h;
    const float* gu_i = gu_.f32() + first * 2 * f;
    float* d_gu_i = d_gu + first * 2 * f;
    ops.Gemm(kT, kN, h, f, n, 1.0f, dy_i, h, act_.f32() + first * f, f, 1.0f, g_down, f);
    ops.Gemm(kN, kN, n, f, h, 1.0f, dy_i, h, w_down, f, 0.0f, d_act + first * f, f);
    ops.SwiGluBackward(n, f, gu_i, gu_i + f, 2 * f, d_act + first * f, f, d_gu_i, d_gu_i + f);
    ops.Gemm(kT, kN, 2 * f, h, n, 1.0f, d_gu_i, 2 * f, grouped_in_.f32() + first * h, h, 1.0f,
             g_gu, h);
    ops.Gemm(kN, kN, n, h, 2 * f, 1.0f, d_gu_i, 2 * f, w_gu, h, 0.0f, d_grouped_in + first * h, h);
    first += n;
  }
  float* d_permuted_in = Ensure(s.d_permuted_in, kept * h);
  if (absl::Status st = exchange_->DispatchBackward(plan, d_grouped_in, h, d_permuted_in);
      !st.ok()) {
    return st;
  }
  ops.MoeUnpermute(t, k, h, d_permuted_in, row_of, nullptr, dh);

  // The router: logits = h2 @ router^T, in full precision.
  const kernels::GemmScopeGuard full(ops, kernels::GemmScope::kDefault);
  float* d_logits = Ensure(s.d_logits, t * e_count);
  ops.MoeRouterBackward(RouteDims(d), reinterpret_cast<const int32_t*>(expert_.data()),
                        weight_.f32(), scores_.f32(), probs_.f32(),
                        reinterpret_cast<const int64_t*>(counts_.data()), d_weight, loss_scale,
                        d_logits);
  ops.Gemm(kT, kN, e_count, h, t, 1.0f, d_logits, e_count, h2, h, 1.0f, g.router, h);
  ops.Gemm(kN, kN, t, h, e_count, 1.0f, d_logits, e_count, w.router, h, 1.0f, dh, h);
  return absl::OkStatus();
}

void MoeLayer::AddStats(int64_t slot, MoeStepStats* stats) const {
  const size_t e_count = acts_.routed.size();
  const size_t need = static_cast<size_t>(slot + 1) * e_count;
  if (stats->tokens_per_expert.size() < need) stats->tokens_per_expert.resize(need, 0.0);
  for (size_t e = 0; e < e_count; ++e) {
    stats->tokens_per_expert[static_cast<size_t>(slot) * e_count + e] +=
        static_cast<double>(acts_.routed[e]);
  }
  stats->dropped += static_cast<double>(acts_.dropped);
  stats->assignments += static_cast<double>(acts_.assignments);
  stats->aux_loss += acts_.aux_loss;
}

int64_t MoeLayer::ActivationBytes() const {
  int64_t bytes = 0;
  for (const kernels::Buffer* b : {&logits_, &permuted_, &grouped_in_, &gu_, &act_, &grouped_out_,
                                   &permuted_out_, &shared_gu_, &shared_act_, &expert_, &weight_,
                                   &scores_, &probs_, &row_of_, &assignment_of_, &counts_,
                                   &prob_sum_, &bias_}) {
    bytes += b->bytes();
  }
  return bytes;
}

}  // namespace loom::engine
