// RingAttention over real Gloo groups of threads (cp2, cp4): every rank's
// output, log-sum-exp and q/k/v gradients equal the reference full attention
// of the whole sequence at that rank's zigzag positions; each rank sends
// exactly the bytes of RingTrafficBytes; the causal FLOP counter is the same
// on every rank.
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/reference/attention.h"
#include "tests/comm/rank_harness.h"
#include "worker/engine/context_parallel/ring_attention.h"

namespace loom::engine {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

int64_t SendBytes(const comm::Communicator& c) {
  const comm::CommStats s = c.Stats();
  auto it = s.find("send");
  return it == s.end() ? 0 : it->second.bytes;
}

void CheckRing(int cp, bool causal) {
  const int64_t batch = 2, seq = 8 * cp, heads = 4, kv_heads = 2, hd = 8;
  const int64_t qw = heads * hd, kw = kv_heads * hd, width = qw + 2 * kw + 3;  // fused, padded
  auto z = ZigzagSplit::Make(seq, cp);
  ASSERT_TRUE(z.ok());
  RingDims d;
  d.batch = batch;
  d.heads = heads;
  d.kv_heads = kv_heads;
  d.head_dim = hd;
  d.causal = causal;
  d.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::vector<float> qkv = Random(batch * seq * width, 11), dout = Random(batch * seq * qw, 12);
  kernels::AttentionDims full;
  full.batch = batch;
  full.seq_q = full.seq_kv = seq;
  full.num_heads = heads;
  full.num_kv_heads = kv_heads;
  full.head_dim = hd;
  full.causal = causal;
  full.scale = d.scale;
  full.q_row_stride = full.k_row_stride = full.v_row_stride = width;
  full.o_row_stride = qw;
  std::vector<float> out(batch * seq * qw), lse(batch * heads * seq), dqkv(qkv.size(), 0.0f);
  kernels::reference::AttentionForward(full, qkv.data(), qkv.data() + qw, qkv.data() + qw + kw,
                                       out.data(), lse.data());
  kernels::reference::AttentionBackward(full, qkv.data(), qkv.data() + qw, qkv.data() + qw + kw,
                                        dout.data(), dqkv.data(), dqkv.data() + qw,
                                        dqkv.data() + qw + kw);
  comm::InProcessStore store;
  auto group = comm::testing::MakeGroup(store, cp, absl::Seconds(60), "cp");
  std::vector<RingFlops> flops(cp);
  comm::testing::RunRanks(group, [&](int r, comm::Communicator& c) {
    auto ops = kernels::cpu::MakeCpuOps(1);
    // This rank's rows, zigzag order, as the model holds them.
    auto rows_of = [&](const std::vector<float>& t, int64_t w) {
      std::vector<float> local;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t p : z->Positions(r)) {
          const float* row = t.data() + (b * seq + p) * w;
          local.insert(local.end(), row, row + w);
        }
      return local;
    };
    const std::vector<float> lqkv = rows_of(qkv, width), ldo = rows_of(dout, qw);
    std::vector<float> lout(batch * z->local_seq() * qw), llse(RingLseFloats(d, *z)),
        ldqkv(lqkv.size(), 7.0f);
    RingAttention ring(*ops, c);
    ASSERT_TRUE(ring.Forward(d, *z, lqkv.data(), width, lout.data(), llse.data()).ok());
    const int64_t after_forward = SendBytes(c);
    ASSERT_TRUE(ring.Backward(d, *z, lqkv.data(), width, lout.data(), llse.data(), ldo.data(),
                              ldqkv.data())
                    .ok());
    const RingTraffic want = RingTrafficBytes(d, *z);
    EXPECT_EQ(after_forward, want.forward_bytes) << "rank " << r;
    EXPECT_EQ(SendBytes(c) - after_forward, want.backward_bytes) << "rank " << r;
    flops[r] = ring.flops();
    const std::vector<float> want_out = rows_of(out, qw), want_d = rows_of(dqkv, width);
    for (size_t i = 0; i < want_out.size(); ++i)
      ASSERT_NEAR(lout[i], want_out[i], 2e-4) << "out, rank " << r << " at " << i;
    for (int64_t t = 0; t < batch * z->local_seq(); ++t)
      for (int64_t e = 0; e < qw + 2 * kw; ++e)  // the padding columns are not attention's
        ASSERT_NEAR(ldqkv[t * width + e], want_d[t * width + e], 2e-4)
            << "dqkv, rank " << r << " row " << t << " col " << e;
    for (int64_t b = 0; b < batch; ++b)
      for (int c2 = 0; c2 < 2; ++c2)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < z->chunk; ++i)
            ASSERT_NEAR(llse[((b * 2 + c2) * heads + h) * z->chunk + i],
                        lse[(b * heads + h) * seq + z->ChunkStart(r, c2) + i], 2e-4);
  });
  for (int r = 1; r < cp; ++r) {
    EXPECT_EQ(flops[r].forward, flops[0].forward) << "rank " << r;
    EXPECT_EQ(flops[r].backward, flops[0].backward) << "rank " << r;
  }
}

TEST(RingAttention, Cp2CausalEqualsFullAttention) { CheckRing(2, true); }
TEST(RingAttention, Cp4CausalEqualsFullAttention) { CheckRing(4, true); }
TEST(RingAttention, Cp2FullMaskEqualsFullAttention) { CheckRing(2, false); }
TEST(RingAttention, Cp4FullMaskEqualsFullAttention) { CheckRing(4, false); }

}  // namespace
}  // namespace loom::engine
