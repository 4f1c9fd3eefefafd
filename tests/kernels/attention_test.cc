// The tiled CPU attention against the full-matrix reference: causal and full,
// grouped-query, sequence lengths around the 64-row tile, strided (fused QKV)
// layouts, position offsets; forward output and log-sum-exp, and backward.
// Tolerances: 2e-5 relative to the tensor's scale. The tiled kernel sums in
// fp32 in another order than the reference's double, and uses a polynomial
// exp accurate to ~2 ulp; errors are ~1e-6, a wrong mask or rescale is O(1).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/reference/attention.h"
#include "tests/kernels/test_util.h"

namespace loom::kernels {
namespace {

using testing::MaxRelDiff;
using testing::RandomVector;

struct Case {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  bool causal;
  int64_t q_offset = 0, kv_offset = 0;
};

std::string Name(const Case& c) {
  return "b" + std::to_string(c.batch) + " sq" + std::to_string(c.seq_q) + " skv" +
         std::to_string(c.seq_kv) + " h" + std::to_string(c.heads) + "/" +
         std::to_string(c.kv_heads) + " d" + std::to_string(c.head_dim) +
         (c.causal ? " causal" : " full") + " off" + std::to_string(c.q_offset) + "," +
         std::to_string(c.kv_offset);
}

// q, k, v as column slices of one fused [tokens, (h + 2 kvh) * d] buffer, as
// the model lays them out; out in its own [tokens, h * d] buffer.
struct Tensors {
  AttentionDims dims;
  std::vector<float> qkv, kv_extra, d_out;
  const float* q() const { return qkv.data(); }
};

AttentionDims MakeDims(const Case& c) {
  AttentionDims d;
  d.batch = c.batch;
  d.seq_q = c.seq_q;
  d.seq_kv = c.seq_kv;
  d.num_heads = c.heads;
  d.num_kv_heads = c.kv_heads;
  d.head_dim = c.head_dim;
  d.causal = c.causal;
  d.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  d.q_row_stride = c.heads * c.head_dim;
  d.k_row_stride = d.v_row_stride = 2 * c.kv_heads * c.head_dim;  // k | v fused
  d.o_row_stride = c.heads * c.head_dim;
  d.q_offset = c.q_offset;
  d.kv_offset = c.kv_offset;
  return d;
}

void CheckCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(Name(c));
  cpu::CpuOps ops(2);
  const AttentionDims d = MakeDims(c);
  const int64_t q_size = c.batch * c.seq_q * d.q_row_stride;
  const int64_t kv_size = c.batch * c.seq_kv * d.k_row_stride;
  const auto q = RandomVector(q_size, seed, -2.0f, 2.0f);
  const auto kv = RandomVector(kv_size, seed + 1, -2.0f, 2.0f);
  const float* k = kv.data();
  const float* v = kv.data() + c.kv_heads * c.head_dim;
  std::vector<float> out(q_size), out_ref(q_size);
  std::vector<float> lse(c.batch * c.heads * c.seq_q), lse_ref(lse.size());
  ops.AttentionForward(d, q.data(), k, v, out.data(), lse.data());
  reference::AttentionForward(d, q.data(), k, v, out_ref.data(), lse_ref.data());
  EXPECT_LT(MaxRelDiff(out, out_ref), 2e-5);
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(lse_ref[i])) {
      ASSERT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "fully masked row " << i;
    } else {
      ASSERT_NEAR(lse[i], lse_ref[i], 2e-5 * (1 + std::abs(lse_ref[i]))) << i;
    }
  }

  const auto d_out = RandomVector(q_size, seed + 2);
  std::vector<float> dq(q_size, 7.0f), dq_ref(q_size);
  std::vector<float> dkv(kv_size, 7.0f), dkv_ref(kv_size);
  float* dk = dkv.data();
  float* dv = dkv.data() + c.kv_heads * c.head_dim;
  ops.AttentionBackward(d, q.data(), k, v, out.data(), lse.data(), d_out.data(), dq.data(), dk,
                        dv);
  reference::AttentionBackward(d, q.data(), k, v, d_out.data(), dq_ref.data(), dkv_ref.data(),
                               dkv_ref.data() + c.kv_heads * c.head_dim);
  // Floor 1e-2 (inputs are O(1)): with one visible key dQ is exactly 0 and
  // both sides are rounding noise near 1e-7.
  EXPECT_LT(MaxRelDiff(dq, dq_ref, 1e-2), 2e-5);
  EXPECT_LT(MaxRelDiff(dkv, dkv_ref, 1e-2), 2e-5);
}

TEST(AttentionTest, CausalAndFullAcrossTileBoundaries) {
  uint32_t seed = 1;
  for (bool causal : {true, false})
    for (int64_t seq : {1, 7, 63, 64, 65, 130})
      CheckCase({2, seq, seq, 4, 4, 16, causal}, seed += 3);
}

TEST(AttentionTest, GroupedQueryHeads) {
  uint32_t seed = 100;
  for (bool causal : {true, false}) {
    CheckCase({1, 70, 70, 4, 2, 16, causal}, seed += 3);
    CheckCase({2, 33, 33, 6, 2, 8, causal}, seed += 3);
    CheckCase({1, 129, 129, 4, 1, 32, causal}, seed += 3);
  }
}

TEST(AttentionTest, HeadDimsIncludingOddAndLarge) {
  uint32_t seed = 200;
  for (int64_t hd : {2, 6, 64, 128}) CheckCase({1, 80, 80, 2, 1, hd, true}, seed += 3);
}

TEST(AttentionTest, DifferentQueryAndKeyLengthsWithOffsets) {
  uint32_t seed = 300;
  // Queries are the second half of a 200-token sequence whose keys all arrive.
  CheckCase({1, 100, 200, 4, 2, 16, true, 100, 0}, seed += 3);
  // Keys are a later chunk than the queries: early queries see nothing.
  CheckCase({2, 70, 50, 2, 2, 8, true, 0, 30}, seed += 3);
  CheckCase({1, 40, 90, 2, 1, 8, false, 0, 0}, seed += 3);
}

TEST(AttentionTest, BitIdenticalAcrossRunsAndThreadCounts) {
  const Case c{3, 100, 100, 6, 2, 32, true};
  const AttentionDims d = MakeDims(c);
  const auto q = RandomVector(c.batch * c.seq_q * d.q_row_stride, 5);
  const auto kv = RandomVector(c.batch * c.seq_kv * d.k_row_stride, 6);
  const auto d_out = RandomVector(q.size(), 7);
  auto run = [&](int threads) {
    cpu::CpuOps ops(threads);
    std::vector<float> out(q.size()), lse(c.batch * c.heads * c.seq_q), dq(q.size()),
        dkv(kv.size());
    const float* k = kv.data();
    const float* v = kv.data() + c.kv_heads * c.head_dim;
    ops.AttentionForward(d, q.data(), k, v, out.data(), lse.data());
    ops.AttentionBackward(d, q.data(), k, v, out.data(), lse.data(), d_out.data(), dq.data(),
                          dkv.data(), dkv.data() + c.kv_heads * c.head_dim);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), dq.begin(), dq.end());
    out.insert(out.end(), dkv.begin(), dkv.end());
    return out;
  };
  const auto first = run(2);
  EXPECT_EQ(first, run(2));
  EXPECT_EQ(first, run(1));
  cpu::CpuOps restore(0);
}

}  // namespace
}  // namespace loom::kernels
