// Finite-difference checks of every backward of the CPU backend. The loss is
// L = sum(w * f(x)) for a fixed random w, so dL/df = w is fed to the backward;
// the numeric gradient is a central difference of the reference forward run in
// double (step 1e-4: truncation ~1e-8, rounding ~1e-12). The analytic side is
// fp32, so the bound is 1e-4 relative to the gradient's scale: rounding stays
// near 1e-6, while a wrong formula is off by O(1).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/reference/attention.h"
#include "kernels/reference/dense.h"
#include "kernels/reference/loss_optim.h"
#include "kernels/rope_tables.h"
#include "tests/kernels/test_util.h"

namespace loom::kernels {
namespace {

using testing::RandomIds;
using testing::RandomVector;
using testing::ToDouble;

constexpr double kStep = 1e-4;
constexpr double kTolerance = 1e-4;

double Weighted(const std::vector<double>& out, const std::vector<float>& w) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
  return s;
}

// Compares analytic[i] with the central difference of loss() in inputs[i] for
// up to `samples` indices (all when the tensor is small).
void CheckGradient(const char* what, std::vector<double>* inputs, const std::vector<float>& analytic,
                   const std::function<double()>& loss, int samples = 60) {
  SCOPED_TRACE(what);
  ASSERT_EQ(inputs->size(), analytic.size());
  std::mt19937 gen(42);
  std::vector<size_t> idx;
  if (static_cast<int>(inputs->size()) <= samples) {
    for (size_t i = 0; i < inputs->size(); ++i) idx.push_back(i);
  } else {
    std::uniform_int_distribution<size_t> dist(0, inputs->size() - 1);
    for (int s = 0; s < samples; ++s) idx.push_back(dist(gen));
  }
  double scale = 1e-8;
  for (float g : analytic) scale = std::max(scale, std::abs(static_cast<double>(g)));
  for (size_t i : idx) {
    const double x0 = (*inputs)[i];
    (*inputs)[i] = x0 + kStep;
    const double up = loss();
    (*inputs)[i] = x0 - kStep;
    const double down = loss();
    (*inputs)[i] = x0;
    const double numeric = (up - down) / (2 * kStep);
    ASSERT_NEAR(analytic[i], numeric, kTolerance * scale) << "index " << i;
  }
}

TEST(GradCheckTest, RmsNorm) {
  cpu::CpuOps ops(2);
  const int64_t rows = 9, dim = 24;
  const double eps = 1e-5;
  const auto x = RandomVector(rows * dim, 1, -2.0f, 2.0f);
  const auto w = RandomVector(dim, 2, 0.5f, 1.5f);
  const auto w_out = RandomVector(rows * dim, 3);
  std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim), dw(dim, 0.0f);
  ops.RmsNormForward(x.data(), w.data(), rows, dim, static_cast<float>(eps), y.data(), rstd.data());
  ops.RmsNormBackward(w_out.data(), x.data(), w.data(), rstd.data(), rows, dim, dx.data(), false,
                      dw.data());
  auto xd = ToDouble(x), wd = ToDouble(w);
  auto loss = [&] {
    std::vector<double> out(rows * dim), rs(rows);
    reference::RmsNormForward(xd.data(), wd.data(), rows, dim, eps, out.data(), rs.data());
    return Weighted(out, w_out);
  };
  CheckGradient("dx", &xd, dx, loss);
  CheckGradient("dweight", &wd, dw, loss);
}

TEST(GradCheckTest, Rope) {
  cpu::CpuOps ops(2);
  const int64_t batch = 2, seq = 5, heads = 2, hd = 8, stride = heads * hd;
  const double theta = 10000.0;
  const RopeTables t = MakeRopeTables(16, hd, theta);
  const auto x = RandomVector(batch * seq * stride, 4);
  auto dx = RandomVector(batch * seq * stride, 5);  // starts as w_out
  const auto w_out = dx;
  ops.RopeBackward(dx.data(), batch, seq, heads, hd, stride, t.cos.data(), t.sin.data(), 3);
  auto xd = ToDouble(x);
  auto loss = [&] {
    auto out = xd;
    reference::Rope(out.data(), batch, seq, heads, hd, stride, theta, 3, false);
    return Weighted(out, w_out);
  };
  CheckGradient("dx", &xd, dx, loss);
}

TEST(GradCheckTest, SwiGlu) {
  cpu::CpuOps ops(2);
  const int64_t rows = 6, dim = 10, stride = 2 * dim;
  const auto gu = RandomVector(rows * stride, 6, -4.0f, 4.0f);
  const auto w_out = RandomVector(rows * dim, 7);
  std::vector<float> dgu(rows * stride);
  ops.SwiGluBackward(rows, dim, gu.data(), gu.data() + dim, stride, w_out.data(), dim,
                     dgu.data(), dgu.data() + dim);
  auto gud = ToDouble(gu);
  auto loss = [&] {
    std::vector<double> out(rows * dim);
    reference::SwiGluForward(rows, dim, gud.data(), gud.data() + dim, stride, out.data(), dim);
    return Weighted(out, w_out);
  };
  CheckGradient("d_gate_up", &gud, dgu, loss);
}

TEST(GradCheckTest, Embedding) {
  cpu::CpuOps ops(2);
  const int64_t vocab = 7, dim = 5, tokens = 20;
  const auto table = RandomVector(vocab * dim, 8);
  const auto ids = RandomIds(tokens, vocab, 9);
  const auto w_out = RandomVector(tokens * dim, 10);
  std::vector<float> d_table(vocab * dim, 0.0f);
  ops.EmbeddingBackward(ids.data(), tokens, w_out.data(), vocab, dim, d_table.data());
  auto td = ToDouble(table);
  auto loss = [&] {
    std::vector<double> out(tokens * dim);
    reference::EmbeddingForward(ids.data(), tokens, td.data(), dim, out.data());
    return Weighted(out, w_out);
  };
  CheckGradient("d_table", &td, d_table, loss);
}

TEST(GradCheckTest, CrossEntropyMean) {
  cpu::CpuOps ops(2);
  const int64_t rows = 8, vocab = 13;
  const auto logits = RandomVector(rows * vocab, 11, -3.0f, 3.0f);
  auto targets = RandomIds(rows, vocab, 12);
  targets[2] = -100;  // ignored: the mean is over the 7 others
  const double scale = 1.0 / 7.0;
  auto grad = logits;
  std::vector<float> row_loss(rows);
  ops.CrossEntropyForwardBackward(grad.data(), targets.data(), rows, vocab,
                                  static_cast<float>(scale), row_loss.data());
  auto ld = ToDouble(logits);
  auto loss = [&] {
    std::vector<double> rl(rows);
    reference::CrossEntropy(ld.data(), targets.data(), rows, vocab, 0.0, rl.data(),
                            static_cast<double*>(nullptr));
    double s = 0;
    for (double v : rl) s += v;
    return s * scale;
  };
  CheckGradient("d_logits", &ld, grad, loss, 200);
}

void CheckAttention(bool causal, int64_t seq, int64_t heads, int64_t kv_heads) {
  SCOPED_TRACE(causal ? "causal" : "full");
  cpu::CpuOps ops(2);
  AttentionDims d;
  d.batch = 2;
  d.seq_q = d.seq_kv = seq;
  d.num_heads = heads;
  d.num_kv_heads = kv_heads;
  d.head_dim = 8;
  d.causal = causal;
  d.scale = 1.0f / std::sqrt(8.0f);
  d.q_row_stride = d.o_row_stride = heads * 8;
  d.k_row_stride = d.v_row_stride = kv_heads * 8;
  const auto q = RandomVector(d.batch * seq * heads * 8, 13, -1.5f, 1.5f);
  const auto k = RandomVector(d.batch * seq * kv_heads * 8, 14, -1.5f, 1.5f);
  const auto v = RandomVector(d.batch * seq * kv_heads * 8, 15);
  const auto w_out = RandomVector(q.size(), 16);
  std::vector<float> out(q.size()), lse(d.batch * heads * seq), dq(q.size()), dk(k.size()),
      dv(v.size());
  ops.AttentionForward(d, q.data(), k.data(), v.data(), out.data(), lse.data());
  ops.AttentionBackward(d, q.data(), k.data(), v.data(), out.data(), lse.data(), w_out.data(),
                        dq.data(), dk.data(), dv.data());
  auto qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v);
  auto loss = [&] {
    std::vector<double> o(q.size()), l(lse.size());
    reference::AttentionForward(d, qd.data(), kd.data(), vd.data(), o.data(), l.data());
    return Weighted(o, w_out);
  };
  CheckGradient("dq", &qd, dq, loss, 40);
  CheckGradient("dk", &kd, dk, loss, 40);
  CheckGradient("dv", &vd, dv, loss, 40);
}

TEST(GradCheckTest, AttentionCausalGqaAcrossTiles) { CheckAttention(true, 70, 4, 2); }
TEST(GradCheckTest, AttentionFull) { CheckAttention(false, 67, 2, 1); }

}  // namespace
}  // namespace loom::kernels
