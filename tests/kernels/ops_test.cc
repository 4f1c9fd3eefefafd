// Each CPU op against its plain reference (kernels/reference) on random
// inputs. Tolerances are relative to the output's scale: 1e-5 where the CPU
// kernel sums in fp32 what the reference sums in double (hundreds of terms,
// ~1e-7 per rounding), exact where the order of operations is the same.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/reference/dense.h"
#include "kernels/reference/loss_optim.h"
#include "kernels/rope_tables.h"
#include "tests/kernels/test_util.h"

namespace loom::kernels {
namespace {

using testing::MaxRelDiff;
using testing::RandomIds;
using testing::RandomVector;

TEST(GemmTest, AllTransposesAlphaBetaAndLeadingDims) {
  cpu::CpuOps ops(2);
  const int64_t m = 37, n = 29, k = 53;
  for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      // Leading dimensions wider than the matrices: submatrix views.
      const int64_t lda = (ta == Transpose::kNo ? k : m) + 3;
      const int64_t ldb = (tb == Transpose::kNo ? n : k) + 5;
      const int64_t ldc = n + 2;
      const auto a = RandomVector((ta == Transpose::kNo ? m : k) * lda, 1);
      const auto b = RandomVector((tb == Transpose::kNo ? k : n) * ldb, 2);
      auto c = RandomVector(m * ldc, 3);
      auto c_ref = c;
      ops.Gemm(ta, tb, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, 0.5f, c.data(), ldc);
      reference::Gemm(ta, tb, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, 0.5f, c_ref.data(),
                      ldc);
      EXPECT_LT(MaxRelDiff(c, c_ref), 1e-5) << "ta=" << int(ta) << " tb=" << int(tb);
    }
  }
}

// Large enough that the backend splits the output over threads (by rows when
// m >= n, else by columns), with every transpose.
TEST(GemmTest, ThreadPartitionedShapesMatchReference) {
  cpu::CpuOps ops(2);
  for (auto [m, n, k] : {std::array<int64_t, 3>{301, 67, 150}, std::array<int64_t, 3>{45, 290, 170}}) {
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        const int64_t lda = ta == Transpose::kNo ? k : m, ldb = tb == Transpose::kNo ? n : k;
        const auto a = RandomVector(m * k, 21), b = RandomVector(k * n, 22);
        auto c = RandomVector(m * n, 23);
        auto c_ref = c;
        ops.Gemm(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), n);
        reference::Gemm(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, c_ref.data(), n);
        EXPECT_LT(MaxRelDiff(c, c_ref), 1e-5) << m << "x" << n << " ta=" << int(ta) << " tb=" << int(tb);
      }
    }
  }
}

TEST(EmbeddingTest, ForwardGathersAndBackwardScatterAddsInOrder) {
  cpu::CpuOps ops(2);
  const int64_t vocab = 11, dim = 70, tokens = 200;  // repeated ids exercise accumulation
  const auto table = RandomVector(vocab * dim, 4);
  const auto ids = RandomIds(tokens, vocab, 5);
  std::vector<float> out(tokens * dim), out_ref(tokens * dim);
  ops.EmbeddingForward(ids.data(), tokens, table.data(), vocab, dim, out.data());
  reference::EmbeddingForward(ids.data(), tokens, table.data(), dim, out_ref.data());
  EXPECT_EQ(out, out_ref);
  const auto d_out = RandomVector(tokens * dim, 6);
  auto d_table = RandomVector(vocab * dim, 7);  // accumulates into existing values
  auto d_table_ref = d_table;
  ops.EmbeddingBackward(ids.data(), tokens, d_out.data(), vocab, dim, d_table.data());
  reference::EmbeddingBackward(ids.data(), tokens, d_out.data(), dim, d_table_ref.data());
  EXPECT_EQ(d_table, d_table_ref);  // same order of additions: bit-identical
}

TEST(RmsNormTest, ForwardAndBackwardMatchReference) {
  cpu::CpuOps ops(2);
  const int64_t rows = 150, dim = 72;
  const float eps = 1e-5f;
  const auto x = RandomVector(rows * dim, 8, -2.0f, 2.0f);
  const auto w = RandomVector(dim, 9, 0.5f, 1.5f);
  std::vector<float> y(rows * dim), y_ref(rows * dim), rstd(rows), rstd_ref(rows);
  ops.RmsNormForward(x.data(), w.data(), rows, dim, eps, y.data(), rstd.data());
  reference::RmsNormForward(x.data(), w.data(), rows, dim, eps, y_ref.data(), rstd_ref.data());
  EXPECT_LT(MaxRelDiff(y, y_ref), 1e-5);
  EXPECT_LT(MaxRelDiff(rstd, rstd_ref), 1e-5);

  const auto dy = RandomVector(rows * dim, 10);
  for (bool accumulate : {false, true}) {
    auto dx = RandomVector(rows * dim, 11);
    const auto dx0 = dx;
    std::vector<float> dx_ref(rows * dim);
    auto dw = RandomVector(dim, 12);
    auto dw_ref = dw;
    ops.RmsNormBackward(dy.data(), x.data(), w.data(), rstd.data(), rows, dim, dx.data(),
                        accumulate, dw.data());
    reference::RmsNormBackward(dy.data(), x.data(), w.data(), rows, dim, eps, dx_ref.data(),
                               dw_ref.data());
    if (accumulate)
      for (size_t i = 0; i < dx_ref.size(); ++i) dx_ref[i] += dx0[i];
    EXPECT_LT(MaxRelDiff(dx, dx_ref), 1e-5) << accumulate;
    EXPECT_LT(MaxRelDiff(dw, dw_ref), 1e-5) << accumulate;
  }
}

TEST(RopeTest, ForwardAndBackwardMatchReferenceOnStridedRows) {
  cpu::CpuOps ops(2);
  const int64_t batch = 2, seq = 19, heads = 3, hd = 16, stride = heads * hd + 40;
  const int64_t offset = 5;
  const double theta = 10000.0;
  const RopeTables tables = MakeRopeTables(64, hd, theta);
  for (bool inverse : {false, true}) {
    auto x = RandomVector(batch * seq * stride, 13);
    auto x_ref = x;
    const auto x0 = x;
    if (inverse) {
      ops.RopeBackward(x.data(), batch, seq, heads, hd, stride, tables.cos.data(),
                       tables.sin.data(), offset);
    } else {
      ops.RopeForward(x.data(), batch, seq, heads, hd, stride, tables.cos.data(),
                      tables.sin.data(), offset);
    }
    reference::Rope(x_ref.data(), batch, seq, heads, hd, stride, theta, offset, inverse);
    EXPECT_LT(MaxRelDiff(x, x_ref), 1e-6);
    // Columns past heads * head_dim are not touched.
    for (int64_t t = 0; t < batch * seq; ++t)
      for (int64_t c = heads * hd; c < stride; ++c) ASSERT_EQ(x[t * stride + c], x0[t * stride + c]);
  }
}

TEST(RopeTest, TablesFollowHuggingFaceFrequencies) {
  const RopeTables t = MakeRopeTables(10, 8, 500000.0);
  // inv_freq[i] = theta^(-2i/d); position 7, i = 1.
  const double angle = 7.0 * std::pow(500000.0, -2.0 / 8.0);
  EXPECT_FLOAT_EQ(t.cos[7 * 4 + 1], static_cast<float>(std::cos(angle)));
  EXPECT_FLOAT_EQ(t.sin[7 * 4 + 1], static_cast<float>(std::sin(angle)));
  EXPECT_EQ(t.cos[0], 1.0f);
}

TEST(SwiGluTest, ForwardAndBackwardMatchReference) {
  cpu::CpuOps ops(2);
  const int64_t rows = 33, dim = 50, stride = 2 * dim;  // gate | up halves of one row
  const auto gu = RandomVector(rows * stride, 14, -6.0f, 6.0f);
  std::vector<float> out(rows * dim), out_ref(rows * dim);
  ops.SwiGluForward(rows, dim, gu.data(), gu.data() + dim, stride, out.data(), dim);
  reference::SwiGluForward(rows, dim, gu.data(), gu.data() + dim, stride, out_ref.data(), dim);
  EXPECT_LT(MaxRelDiff(out, out_ref), 1e-6);
  const auto d_out = RandomVector(rows * dim, 15);
  std::vector<float> dgu(rows * stride), dgu_ref(rows * stride);
  ops.SwiGluBackward(rows, dim, gu.data(), gu.data() + dim, stride, d_out.data(), dim,
                     dgu.data(), dgu.data() + dim);
  reference::SwiGluBackward(rows, dim, gu.data(), gu.data() + dim, stride, d_out.data(), dim,
                            dgu_ref.data(), dgu_ref.data() + dim);
  EXPECT_LT(MaxRelDiff(dgu, dgu_ref), 1e-6);
}

TEST(CrossEntropyTest, FusedForwardBackwardMatchesReferenceAndIgnoresNegativeTargets) {
  cpu::CpuOps ops(2);
  const int64_t rows = 40, vocab = 300;
  const auto logits = RandomVector(rows * vocab, 16, -8.0f, 8.0f);
  auto targets = RandomIds(rows, static_cast<int32_t>(vocab), 17);
  targets[3] = -100;
  targets[17] = -1;
  const float scale = 1.0f / 38.0f;
  std::vector<float> loss(rows), loss_ref(rows), loss_fwd(rows), grad_ref(rows * vocab);
  auto grad = logits;
  ops.CrossEntropyForward(logits.data(), targets.data(), rows, vocab, loss_fwd.data());
  ops.CrossEntropyForwardBackward(grad.data(), targets.data(), rows, vocab, scale, loss.data());
  reference::CrossEntropy(logits.data(), targets.data(), rows, vocab, scale, loss_ref.data(),
                          grad_ref.data());
  EXPECT_LT(MaxRelDiff(loss, loss_ref), 1e-6);
  EXPECT_EQ(loss, loss_fwd);
  EXPECT_LT(MaxRelDiff(grad, grad_ref), 1e-5);
  EXPECT_EQ(loss[3], 0.0f);
  for (int64_t c = 0; c < vocab; ++c) ASSERT_EQ(grad[17 * vocab + c], 0.0f);
}

TEST(AdamWTest, MatchesReferenceOverSteps) {
  const int64_t n = 1000;
  auto p = RandomVector(n, 18);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  auto p_ref = p;
  auto m_ref = m, v_ref = v;
  for (int64_t step = 1; step <= 5; ++step) {
    const auto g = RandomVector(n, 100 + static_cast<uint32_t>(step));
    cpu::AdamWStep(p.data(), g.data(), m.data(), v.data(), n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                   step);
    reference::AdamW(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, 3e-3f, 0.9f, 0.95f,
                     1e-8f, 0.1f, step);
  }
  EXPECT_LT(MaxRelDiff(p, p_ref), 1e-6);
  EXPECT_LT(MaxRelDiff(m, m_ref), 1e-6);
  EXPECT_LT(MaxRelDiff(v, v_ref), 1e-6);
}

// Expected values from torch.optim.AdamW(lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
// weight_decay=0.1, foreach=False), PyTorch 1.13, three steps.
TEST(AdamWTest, MatchesPyTorch) {
  std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.1f, -0.3f};
  std::vector<float> m(5, 0.0f), v(5, 0.0f);
  const std::vector<std::vector<float>> grads = {{0.1f, -0.2f, 0.3f, 0.0f, 1.5f},
                                                 {-0.5f, 0.25f, 0.3f, 1e-4f, -2.0f},
                                                 {0.2f, 0.2f, -0.1f, 0.0f, 0.7f}};
  for (int64_t step = 1; step <= 3; ++step)
    cpu::AdamWStep(p.data(), grads[step - 1].data(), m.data(), v.data(), 5, 1e-2f, 0.9f, 0.95f,
                   1e-8f, 0.1f, step);
  const std::vector<float> expected = {0.49639859795570374f, -0.9930974841117859f,
                                       1.9679133892059326f, 0.08660535514354706f,
                                       -0.3074395954608917f};
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(p[i], expected[i]) << i;
  EXPECT_FLOAT_EQ(m[0], -0.016899997368454933f);
  EXPECT_FLOAT_EQ(v[4], 0.31603124737739563f);
}

TEST(ElementwiseTest, AxpyScaleFillSumSquares) {
  cpu::CpuOps ops(2);
  const int64_t n = 100003;
  const auto x = RandomVector(n, 19);
  auto y = RandomVector(n, 20);
  const auto y0 = y;
  ops.Axpy(n, 0.5f, x.data(), y.data());
  for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(y[i], y0[i] + 0.5f * x[i]);
  ops.Scale(n, 2.0f, y.data());
  for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(y[i], 2.0f * (y0[i] + 0.5f * x[i]));
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  EXPECT_NEAR(ops.SumSquares(x.data(), n), ss, 1e-9 * ss);
  ops.Fill(y.data(), n, 3.0f);
  EXPECT_EQ(y[n - 1], 3.0f);
  Buffer buf = ops.AllocateFloats(10);
  ASSERT_FALSE(buf.empty());
  ops.CopyHostToDevice(buf.data(), x.data(), 10 * sizeof(float));
  std::vector<float> back(10);
  ops.CopyDeviceToHost(back.data(), buf.data(), 10 * sizeof(float));
  EXPECT_EQ(back, std::vector<float>(x.begin(), x.begin() + 10));
}

}  // namespace
}  // namespace loom::kernels
