// Ring attention's arithmetic without communication: every rank's queries
// against every owner's K/V block (RingBlocks on the CPU backend), simulated
// in one process, equal the full attention of kernels/reference for causal
// and full masks, GQA and chunks that cross the kernel's 64-token tiles; the
// LSE merge equals its reference; the zigzag split refuses lengths that do
// not cut into 2 * cp chunks and balances the causal work.
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/reference/attention.h"
#include "worker/engine/context_parallel/ring_blocks.h"
#include "worker/engine/context_parallel/zigzag.h"

namespace loom::engine {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Rank r's rows of a [batch, seq, width] tensor, zigzag order.
std::vector<float> LocalRows(const ZigzagSplit& z, int r, const std::vector<float>& full,
                             int64_t batch, int64_t width) {
  std::vector<float> local;
  for (int64_t b = 0; b < batch; ++b)
    for (int c = 0; c < 2; ++c)
      for (int64_t i = 0; i < z.chunk; ++i) {
        const float* row = full.data() + (b * z.seq_len + z.ChunkStart(r, c) + i) * width;
        local.insert(local.end(), row, row + width);
      }
  return local;
}

struct Case {
  int cp;
  int64_t batch, seq, heads, kv_heads, head_dim;
  bool causal;
};

void CheckRingEqualsFull(const Case& t) {
  auto z = ZigzagSplit::Make(t.seq, t.cp);
  ASSERT_TRUE(z.ok()) << z.status();
  RingDims d;
  d.batch = t.batch;
  d.heads = t.heads;
  d.kv_heads = t.kv_heads;
  d.head_dim = t.head_dim;
  d.causal = t.causal;
  d.scale = 1.0f / std::sqrt(static_cast<float>(t.head_dim));
  const int64_t qw = d.q_width(), kw = d.kv_width();
  const std::vector<float> q = Random(t.batch * t.seq * qw, 1), k = Random(t.batch * t.seq * kw, 2),
                           v = Random(t.batch * t.seq * kw, 3), dout = Random(t.batch * t.seq * qw, 4);
  kernels::AttentionDims full;
  full.batch = t.batch;
  full.seq_q = full.seq_kv = t.seq;
  full.num_heads = t.heads;
  full.num_kv_heads = t.kv_heads;
  full.head_dim = t.head_dim;
  full.causal = t.causal;
  full.scale = d.scale;
  full.q_row_stride = full.o_row_stride = qw;
  full.k_row_stride = full.v_row_stride = kw;
  std::vector<float> out(q.size()), lse(t.batch * t.heads * t.seq), dq(q.size()), dk(k.size()),
      dv(v.size());
  kernels::reference::AttentionForward(full, q.data(), k.data(), v.data(), out.data(), lse.data());
  kernels::reference::AttentionBackward(full, q.data(), k.data(), v.data(), dout.data(), dq.data(),
                                        dk.data(), dv.data());

  auto ops = kernels::cpu::MakeCpuOps(1);
  const int n = t.cp;
  std::vector<std::vector<float>> lq(n), lkv(n), ldo(n), lout(n), llse(n), ldq(n), ldkv(n);
  for (int r = 0; r < n; ++r) {
    lq[r] = LocalRows(*z, r, q, t.batch, qw);
    ldo[r] = LocalRows(*z, r, dout, t.batch, qw);
    lkv[r] = LocalRows(*z, r, k, t.batch, kw);
    const std::vector<float> lv = LocalRows(*z, r, v, t.batch, kw);
    lkv[r].insert(lkv[r].end(), lv.begin(), lv.end());
    lout[r].resize(RingQFloats(d, *z));
    llse[r].resize(RingLseFloats(d, *z));
    ldq[r].assign(RingQFloats(d, *z), 0.0f);
    ldkv[r].assign(RingKvFloats(d, *z), 0.0f);
  }
  for (int r = 0; r < n; ++r) {
    RingBlocks blocks(*ops, d, *z, r);
    blocks.BeginForward(lout[r].data(), llse[r].data());
    for (int step = 0; step < n; ++step) {  // the ring's order: own block first
      const int owner = (r - step + n) % n;
      blocks.ForwardBlock(lq[r].data(), lkv[owner].data(), owner, lout[r].data(), llse[r].data());
    }
    for (int step = 0; step < n; ++step) {
      const int owner = (r - step + n) % n;
      blocks.BackwardBlock(lq[r].data(), lkv[owner].data(), owner, lout[r].data(), llse[r].data(),
                           ldo[r].data(), ldq[r].data(), ldkv[owner].data());
    }
  }
  const double tol = 2e-4;
  for (int r = 0; r < n; ++r) {
    const std::vector<float> want_out = LocalRows(*z, r, out, t.batch, qw);
    const std::vector<float> want_dq = LocalRows(*z, r, dq, t.batch, qw);
    std::vector<float> want_dkv = LocalRows(*z, r, dk, t.batch, kw);
    const std::vector<float> want_dv = LocalRows(*z, r, dv, t.batch, kw);
    want_dkv.insert(want_dkv.end(), want_dv.begin(), want_dv.end());
    for (size_t i = 0; i < want_out.size(); ++i) {
      ASSERT_NEAR(lout[r][i], want_out[i], tol) << "out rank " << r << " at " << i;
      ASSERT_NEAR(ldq[r][i], want_dq[i], tol) << "dq rank " << r << " at " << i;
    }
    for (size_t i = 0; i < want_dkv.size(); ++i)
      ASSERT_NEAR(ldkv[r][i], want_dkv[i], tol) << "dkv rank " << r << " at " << i;
    for (int64_t b = 0; b < t.batch; ++b)
      for (int c = 0; c < 2; ++c)
        for (int64_t h = 0; h < t.heads; ++h)
          for (int64_t i = 0; i < z->chunk; ++i)
            ASSERT_NEAR(llse[r][((b * 2 + c) * t.heads + h) * z->chunk + i],
                        lse[(b * t.heads + h) * t.seq + z->ChunkStart(r, c) + i], tol)
                << "lse rank " << r;
  }
}

TEST(RingMath, Cp2CausalEqualsFullAttention) { CheckRingEqualsFull({2, 2, 40, 2, 2, 16, true}); }
TEST(RingMath, Cp4CausalEqualsFullAttention) { CheckRingEqualsFull({4, 1, 64, 2, 2, 16, true}); }
TEST(RingMath, Cp2FullMaskEqualsFullAttention) { CheckRingEqualsFull({2, 2, 40, 2, 2, 16, false}); }
TEST(RingMath, Cp4FullMaskGqa) { CheckRingEqualsFull({4, 1, 48, 4, 2, 8, false}); }
TEST(RingMath, Cp2CausalGqa) { CheckRingEqualsFull({2, 1, 24, 4, 1, 8, true}); }
TEST(RingMath, ChunksAcrossKernelTiles) { CheckRingEqualsFull({2, 1, 280, 2, 1, 16, true}); }
TEST(RingMath, Cp1IsPlainAttention) { CheckRingEqualsFull({1, 2, 20, 2, 2, 8, true}); }

TEST(RingMath, MergeEqualsReference) {
  const int64_t seq = 7, heads = 3, hd = 5, stride = heads * hd + 2;
  std::vector<float> out = Random(seq * stride, 5), blk = Random(seq * stride, 6);
  std::vector<float> lse = Random(heads * seq, 7), blse = Random(heads * seq, 8);
  lse[0] = -INFINITY;   // a row that saw nothing yet takes the block's
  blse[4] = -INFINITY;  // a block row that saw nothing changes nothing
  std::vector<float> want_out = out, want_lse = lse;
  kernels::reference::AttentionMerge(seq, heads, hd, want_out.data(), stride, want_lse.data(),
                                     blk.data(), stride, blse.data());
  auto ops = kernels::cpu::MakeCpuOps(1);
  ops->AttentionMerge(seq, heads, hd, out.data(), stride, lse.data(), blk.data(), stride,
                      blse.data());
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], want_lse[i], 1e-5);
  for (int64_t i = 0; i < seq; ++i)
    for (int64_t e = 0; e < heads * hd; ++e)
      EXPECT_NEAR(out[i * stride + e], want_out[i * stride + e], 1e-5);
}

TEST(Zigzag, RefusesLengthsThatDoNotSplitInto2CpChunks) {
  auto z = ZigzagSplit::Make(100, 4);
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(z.status().message().find("seq_len 100"), std::string::npos) << z.status();
  EXPECT_NE(z.status().message().find("cp 4"), std::string::npos) << z.status();
  EXPECT_TRUE(ZigzagSplit::Make(96, 4).ok());
}

TEST(Zigzag, RankRHoldsChunksRAnd2CpMinus1MinusR) {
  auto z = ZigzagSplit::Make(16, 4);
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->chunk, 2);
  EXPECT_EQ(z->Positions(0), (std::vector<int64_t>{0, 1, 14, 15}));
  EXPECT_EQ(z->Positions(3), (std::vector<int64_t>{6, 7, 8, 9}));
  std::vector<int32_t> ids(32);
  for (int i = 0; i < 32; ++i) ids[i] = i;
  EXPECT_EQ(LocalTokens(*z, 1, ids.data(), 2), (std::vector<int32_t>{2, 3, 12, 13, 18, 19, 28, 29}));
}

TEST(Zigzag, CausalWorkIsBalanced) {
  for (int cp : {2, 4, 8}) {
    auto z = ZigzagSplit::Make(2 * cp * 32, cp);
    ASSERT_TRUE(z.ok());
    int64_t first = -1;
    for (int r = 0; r < cp; ++r) {
      int64_t pairs = 0;
      for (int owner = 0; owner < cp; ++owner)
        for (int qc = 0; qc < 2; ++qc)
          for (int kc = 0; kc < 2; ++kc)
            pairs += VisiblePairs(true, z->ChunkIndex(r, qc), z->ChunkIndex(owner, kc), z->chunk);
      if (first < 0) first = pairs;
      EXPECT_EQ(pairs, first) << "cp " << cp << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace loom::engine
