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

absl::Status MoeLayer::Forward(const MoeDims& d, const MoeWeights& w, const float* h2,
                               const float* x_mid, float* x_next) {
  kernels::Ops& ops = *ops_;
  const int64_t t = d.tokens, h = d.hidden, e_count = d.num_experts, f = d.expert_ffn;
  // The router stays in full precision (GemmScope::kDefault), as DeepSeek-V3's.
  float* logits = Ensure(logits_, t * e_count);
  ops.Gemm(kN, kT, t, e_count, h, 1.0f, h2, h, w.router, h, 0.0f, logits, e_count);
  std::vector<float> host(static_cast<size_t>(t * e_count));
  ops.CopyDeviceToHost(host.data(), logits, t * e_count * kF);
  acts_.routing = Route(d, host.data(), w.bias, &acts_.aux_loss);
  const MoeRouting& r = acts_.routing;

  // Token rows into permuted order, then to the ranks holding their experts.
  const int64_t kept = r.kept_rows();
  float* permuted = Ensure(permuted_, kept * h);
  for (int64_t row = 0; row < kept; ++row) {
    const int64_t token = r.assignment_of[static_cast<size_t>(row)] / d.top_k;
    ops.CopyDeviceToDevice(permuted + row * h, h2 + token * h, h * kF);
  }
  if (absl::Status s = exchange_->Plan(r.counts, &acts_.plan); !s.ok()) return s;
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
  for (int64_t a = 0; a < t * d.top_k; ++a) {
    const int32_t row = r.row_of[static_cast<size_t>(a)];
    if (row < 0) continue;  // dropped by the capacity
    ops.Axpy(h, r.weight[static_cast<size_t>(a)], permuted_out + row * h, x_next + (a / d.top_k) * h);
  }
  return absl::OkStatus();
}

absl::Status MoeLayer::Backward(const MoeDims& d, const MoeWeights& w, const MoeGrads& g,
                                const float* h2, const float* dy, double loss_scale,
                                MoeScratch& s, float* dh) {
  kernels::Ops& ops = *ops_;
  const int64_t t = d.tokens, h = d.hidden, e_count = d.num_experts, f = d.expert_ffn, k = d.top_k;
  const MoeRouting& r = acts_.routing;
  const ExchangePlan& plan = acts_.plan;
  const int64_t kept = r.kept_rows(), g_rows = plan.grouped_rows;
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
  std::vector<float> dy_host(static_cast<size_t>(t * h));
  std::vector<float> out_host(static_cast<size_t>(kept * h));
  ops.CopyDeviceToHost(dy_host.data(), dy, t * h * kF);
  if (kept > 0) ops.CopyDeviceToHost(out_host.data(), permuted_out_.f32(), kept * h * kF);
  std::vector<float> d_weight(static_cast<size_t>(t * k), 0.0f);
  for (int64_t a = 0; a < t * k; ++a) {
    const int32_t row = r.row_of[static_cast<size_t>(a)];
    if (row < 0) continue;
    const float* x = dy_host.data() + (a / k) * h;
    const float* y = out_host.data() + static_cast<int64_t>(row) * h;
    double dot = 0;
    for (int64_t c = 0; c < h; ++c) dot += static_cast<double>(x[c]) * y[c];
    d_weight[static_cast<size_t>(a)] = static_cast<float>(dot);
  }

  // The expert outputs' gradient, weight * dy[token], in permuted order, to the experts.
  float* d_permuted = Ensure(s.d_permuted, kept * h);
  for (int64_t row = 0; row < kept; ++row) {
    const int32_t a = r.assignment_of[static_cast<size_t>(row)];
    ops.CopyDeviceToDevice(d_permuted + row * h, dy + (a / k) * h, h * kF);
    ops.Scale(h, r.weight[static_cast<size_t>(a)], d_permuted + row * h);
  }
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
  for (int64_t a = 0; a < t * k; ++a) {
    const int32_t row = r.row_of[static_cast<size_t>(a)];
    if (row >= 0) ops.Axpy(h, 1.0f, d_permuted_in + static_cast<int64_t>(row) * h, dh + (a / k) * h);
  }

  // The router: logits = h2 @ router^T, in full precision.
  const kernels::GemmScopeGuard full(ops, kernels::GemmScope::kDefault);
  const std::vector<float> d_logits_host = RouterBackward(d, r, d_weight, loss_scale);
  float* d_logits = Ensure(s.d_logits, t * e_count);
  ops.CopyHostToDevice(d_logits, d_logits_host.data(), t * e_count * kF);
  ops.Gemm(kT, kN, e_count, h, t, 1.0f, d_logits, e_count, h2, h, 1.0f, g.router, h);
  ops.Gemm(kN, kN, t, h, e_count, 1.0f, d_logits, e_count, w.router, h, 1.0f, dh, h);
  return absl::OkStatus();
}

void MoeLayer::AddStats(int64_t slot, MoeStepStats* stats) const {
  const MoeRouting& r = acts_.routing;
  const size_t e_count = r.routed.size();
  const size_t need = static_cast<size_t>(slot + 1) * e_count;
  if (stats->tokens_per_expert.size() < need) stats->tokens_per_expert.resize(need, 0.0);
  for (size_t e = 0; e < e_count; ++e) {
    stats->tokens_per_expert[static_cast<size_t>(slot) * e_count + e] += static_cast<double>(r.routed[e]);
  }
  stats->dropped += static_cast<double>(r.dropped);
  stats->assignments += static_cast<double>(r.expert.size());
  stats->aux_loss += acts_.aux_loss;
}

int64_t MoeLayer::ActivationBytes() const {
  int64_t bytes = 0;
  for (const kernels::Buffer* b : {&logits_, &permuted_, &grouped_in_, &gu_, &act_, &grouped_out_,
                                   &permuted_out_, &shared_gu_, &shared_act_}) {
    bytes += b->bytes();
  }
  return bytes;
}

}  // namespace loom::engine
