// The mixture-of-experts kernels (kernels/cuda/ops/moe.h) against the
// std-only reference (kernels/reference/moe.h), the loops the CPU backend
// runs. Integer outputs (choices, rows, counts) must be identical; the
// permutation and the combine round each operation as the reference does, so
// they must match bit for bit; prob_sum adds the same floats in the same
// order in double (identical). Scores and weights go through double exp,
// whose last bit may differ from the host's (relative 1e-6 after the cast to
// float); the gate gradient and the router backward reduce in another order
// in double (1e-6).
#include <cstring>
#include <vector>

#include "kernels/cuda/ops/moe.h"
#include "kernels/reference/moe.h"
#include "tests/gpu/gpu_test.h"

namespace loom::gpu_test {
namespace {

namespace kc = kernels::cuda;
namespace kref = kernels::reference;
using kernels::MoeRouteDims;
using kernels::MoeScore;

template <typename T>
void ExpectSame(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  CHECK(got.size() == want.size(), what << ": size " << got.size() << " vs " << want.size());
  size_t diff = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (first == got.size()) first = i;
      ++diff;
    }
  }
  std::printf("    %-28s %zu of %zu differ\n", what, diff, got.size());
  CHECK(diff == 0, what << ": " << diff << " elements differ, the first at " << first);
}

struct Routed {
  std::vector<int32_t> expert, row_of, assignment_of;
  std::vector<float> weight, scores, probs;
  std::vector<int64_t> counts;
  std::vector<double> prob_sum;
};

Routed HostRoute(const MoeRouteDims& d, const std::vector<float>& logits, const float* bias) {
  const size_t a = static_cast<size_t>(d.tokens * d.top_k), te = static_cast<size_t>(d.tokens * d.num_experts);
  Routed r{std::vector<int32_t>(a), std::vector<int32_t>(a), std::vector<int32_t>(a, -7),
           std::vector<float>(a), std::vector<float>(te), std::vector<float>(te),
           std::vector<int64_t>(2 * d.num_experts), std::vector<double>(d.num_experts)};
  kref::MoeRoute(d, logits.data(), bias, r.expert.data(), r.weight.data(), r.scores.data(),
                 r.probs.data(), r.row_of.data(), r.assignment_of.data(), r.counts.data(),
                 r.prob_sum.data());
  return r;
}

void RouteCase(MoeScore score, int64_t tokens, int64_t experts, int64_t top_k, int64_t capacity,
               bool with_bias) {
  MoeRouteDims d;
  d.tokens = tokens;
  d.num_experts = experts;
  d.top_k = top_k;
  d.capacity = capacity;
  d.score = score;
  d.aux_loss_coef = 0.01;
  std::printf("  tokens %ld experts %ld top_k %ld capacity %ld %s%s\n", static_cast<long>(tokens),
              static_cast<long>(experts), static_cast<long>(top_k), static_cast<long>(capacity),
              score == MoeScore::kSoftmax ? "softmax" : "sigmoid", with_bias ? " bias" : "");
  const std::vector<float> logits = RandomFloats(tokens * experts, 11, 2.0f);
  const std::vector<float> bias = RandomFloats(experts, 12, 0.05f);
  const Routed want = HostRoute(d, logits, with_bias ? bias.data() : nullptr);
  const size_t a = static_cast<size_t>(tokens * top_k);
  DeviceBuffer<float> dl(logits.size()), db(experts), w(a), s(logits.size()), p(logits.size());
  DeviceBuffer<int32_t> e(a), row_of(a), assignment_of(a);
  DeviceBuffer<int64_t> counts(2 * experts);
  DeviceBuffer<double> prob_sum(experts);
  dl.Upload(logits);
  db.Upload(bias);
  for (auto* b : {&w, &s, &p}) b->Poison();
  e.Poison();
  row_of.Poison();
  assignment_of.Poison();
  counts.Poison();
  prob_sum.Poison();
  LAUNCH_OK(kc::MoeRoute(d, dl.get(), with_bias ? db.get() : nullptr, e.get(), w.get(), s.get(),
                         p.get(), row_of.get(), assignment_of.get(), counts.get(), prob_sum.get(),
                         nullptr));
  ExpectSame("expert", e.Download(), want.expert);
  ExpectSame("row_of", row_of.Download(), want.row_of);
  ExpectSame("counts", counts.Download(), want.counts);
  int64_t kept = 0;
  for (int64_t i = 0; i < experts; ++i) kept += want.counts[i];
  std::vector<int32_t> got_inverse = assignment_of.Download();
  got_inverse.resize(kept);
  std::vector<int32_t> want_inverse(want.assignment_of.begin(), want.assignment_of.begin() + kept);
  ExpectSame("assignment_of", got_inverse, want_inverse);
  ExpectClose("scores", s.Download(), want.scores, 1e-6);
  ExpectClose("probs", p.Download(), want.probs, 1e-6);
  ExpectClose("weight", w.Download(), want.weight, 1e-6);
  const std::vector<double> sums = prob_sum.Download();
  std::vector<float> got_sums(sums.begin(), sums.end()), want_sums(want.prob_sum.begin(), want.prob_sum.end());
  ExpectClose("prob_sum", got_sums, want_sums, 1e-6);
}

GPU_TEST(MoeRouteMatchesReference) {
  RouteCase(MoeScore::kSoftmax, 1000, 8, 2, 0, false);
  RouteCase(MoeScore::kSoftmax, 4096, 64, 6, 0, true);
  RouteCase(MoeScore::kSigmoid, 4096, 256, 8, 160, true);  // DeepSeek-V3's shape, drops
  RouteCase(MoeScore::kSoftmax, 513, 16, 4, 100, false);   // capacity drops, odd tokens
}

GPU_TEST(MoePermuteUnpermuteGateGradMatchReference) {
  MoeRouteDims d;
  d.tokens = 777;
  d.num_experts = 16;
  d.top_k = 3;
  d.capacity = 120;
  const int64_t width = 96;
  const Routed r = HostRoute(d, RandomFloats(d.tokens * d.num_experts, 21, 2.0f), nullptr);
  int64_t kept = 0;
  for (int64_t i = 0; i < d.num_experts; ++i) kept += r.counts[i];
  const size_t a = static_cast<size_t>(d.tokens * d.top_k);
  const std::vector<float> x = RandomFloats(d.tokens * width, 22);
  const std::vector<float> rows = RandomFloats(kept * width, 23);
  const std::vector<float> base = RandomFloats(d.tokens * width, 24);
  DeviceBuffer<float> dx(x.size()), drows(rows.size()), dw(a), out(kept * width), acc(base.size()),
      dweight(a);
  DeviceBuffer<int32_t> row_of(a), assignment_of(a);
  dx.Upload(x);
  drows.Upload(rows);
  dw.Upload(r.weight);
  row_of.Upload(r.row_of);
  assignment_of.Upload(r.assignment_of);
  for (const float* weight : {static_cast<const float*>(nullptr), static_cast<const float*>(dw.get())}) {
    std::vector<float> want(kept * width), want_acc(base);
    kref::MoePermute(kept, d.top_k, width, x.data(), r.assignment_of.data(),
                     weight ? r.weight.data() : nullptr, want.data());
    out.Poison();
    LAUNCH_OK(kc::MoePermute(kept, d.top_k, width, dx.get(), assignment_of.get(), weight, out.get(),
                             nullptr));
    ExpectSame(weight ? "permute (weighted)" : "permute", out.Download(), want);
    kref::MoeUnpermute(d.tokens, d.top_k, width, rows.data(), r.row_of.data(),
                       weight ? r.weight.data() : nullptr, want_acc.data());
    acc.Upload(base);
    LAUNCH_OK(kc::MoeUnpermute(d.tokens, d.top_k, width, drows.get(), row_of.get(), weight,
                               acc.get(), nullptr));
    ExpectSame(weight ? "unpermute (weighted)" : "unpermute", acc.Download(), want_acc);
  }
  std::vector<float> want_dw(a);
  kref::MoeGateGrad(d.tokens, d.top_k, width, x.data(), rows.data(), r.row_of.data(), want_dw.data());
  dweight.Poison();
  LAUNCH_OK(kc::MoeGateGrad(d.tokens, d.top_k, width, dx.get(), drows.get(), row_of.get(),
                            dweight.get(), nullptr));
  ExpectClose("gate grad", dweight.Download(), want_dw, 1e-6);
}

GPU_TEST(MoeRouterBackwardMatchesReference) {
  for (MoeScore score : {MoeScore::kSoftmax, MoeScore::kSigmoid}) {
    MoeRouteDims d;
    d.tokens = 1500;
    d.num_experts = 64;
    d.top_k = 4;
    d.score = score;
    d.aux_loss_coef = 0.01;
    const Routed r = HostRoute(d, RandomFloats(d.tokens * d.num_experts, 31, 2.0f), nullptr);
    const size_t a = static_cast<size_t>(d.tokens * d.top_k);
    const std::vector<float> dweight = RandomFloats(a, 32);
    std::vector<float> want(d.tokens * d.num_experts);
    kref::MoeRouterBackward(d, r.expert.data(), r.weight.data(), r.scores.data(), r.probs.data(),
                            r.counts.data(), dweight.data(), 0.5, want.data());
    DeviceBuffer<int32_t> e(a);
    DeviceBuffer<float> w(a), s(r.scores.size()), p(r.probs.size()), g(a), out(want.size());
    DeviceBuffer<int64_t> counts(r.counts.size());
    e.Upload(r.expert);
    w.Upload(r.weight);
    s.Upload(r.scores);
    p.Upload(r.probs);
    g.Upload(dweight);
    counts.Upload(r.counts);
    out.Poison();
    LAUNCH_OK(kc::MoeRouterBackward(d, e.get(), w.get(), s.get(), p.get(), counts.get(), g.get(),
                                    0.5, out.get(), nullptr));
    ExpectClose(score == MoeScore::kSoftmax ? "d_logits (softmax)" : "d_logits (sigmoid)",
                out.Download(), want, 1e-6);
  }
}

GPU_TEST(MoeRouteRefusesTooManyExperts) {
  MoeRouteDims d;
  d.tokens = 4;
  d.num_experts = kc::kMoeMaxExperts + 1;
  d.top_k = 2;
  CHECK(kc::MoeRoute(d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                     nullptr, nullptr, nullptr) == cudaErrorInvalidValue,
        "E > kMoeMaxExperts must be refused");
}

}  // namespace
}  // namespace loom::gpu_test
