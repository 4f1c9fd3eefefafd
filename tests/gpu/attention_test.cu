// Fused attention forward/backward against the double-precision reference
// (kernels/reference/attention.h) on bf16-exact random inputs.
//
// Tolerances (relative Frobenius norm): the kernels round P and dS to bf16
// (8 significant bits, relative error <= 2^-9) before the second matmul and
// write bf16 outputs (another 2^-9), so errors of a few 1e-3 are expected:
// forward output 1e-2, gradients 2e-2 (two bf16 roundings more, plus D from
// the bf16 output). The LSE is computed in fp32 from fp32 scores: 2e-3 absolute.
#include <cmath>
#include <limits>

#include "kernels/cuda/attention/attention.h"
#include "kernels/reference/attention.h"
#include "tests/gpu/gpu_test.h"

namespace loom::gpu_test {
namespace {

using kernels::AttentionDims;

struct Case {
  int batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  bool causal;
  int64_t q_offset = 0, kv_offset = 0;
  bool fused_qkv = false;  // q, k, v as column slices of one [tokens, (h + 2 kvh) d] buffer
  int block_m = 0;
};

AttentionDims DimsOf(const Case& c) {
  AttentionDims d;
  d.batch = c.batch;
  d.seq_q = c.seq_q;
  d.seq_kv = c.seq_kv;
  d.num_heads = c.heads;
  d.num_kv_heads = c.kv_heads;
  d.head_dim = c.head_dim;
  d.causal = c.causal;
  d.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const int64_t fused = static_cast<int64_t>(c.heads + 2 * c.kv_heads) * c.head_dim;
  d.q_row_stride = c.fused_qkv ? fused : c.heads * c.head_dim;
  d.k_row_stride = c.fused_qkv ? fused : c.kv_heads * c.head_dim;
  d.v_row_stride = d.k_row_stride;
  d.o_row_stride = c.heads * c.head_dim;
  d.q_offset = c.q_offset;
  d.kv_offset = c.kv_offset;
  return d;
}

// Host tensors: with fused_qkv, q/k/v all index into one buffer (k and v at
// column offsets), which is also what the kernel sees.
void RunCase(const Case& c, bool check_backward, uint32_t seed) {
  const AttentionDims d = DimsOf(c);
  std::printf("  case b=%d sq=%d skv=%d h=%d kvh=%d d=%d causal=%d offs=(%lld,%lld) fused=%d bm=%d\n", c.batch,
              c.seq_q, c.seq_kv, c.heads, c.kv_heads, c.head_dim, c.causal, static_cast<long long>(c.q_offset),
              static_cast<long long>(c.kv_offset), c.fused_qkv, c.block_m);
  const int64_t q_elems = c.batch * c.seq_q * d.q_row_stride;
  const int64_t kv_elems = c.batch * c.seq_kv * d.k_row_stride;
  const int64_t o_elems = c.batch * c.seq_q * d.o_row_stride;
  std::vector<float> qkv, q, k, v;
  const float *hq, *hk, *hv;
  if (c.fused_qkv) {
    CHECK(c.seq_q == c.seq_kv, "fused layout needs seq_q == seq_kv");
    qkv = RandomFloats(q_elems, seed, 1.0f, true);
    hq = qkv.data();
    hk = qkv.data() + c.heads * c.head_dim;
    hv = hk + c.kv_heads * c.head_dim;
  } else {
    q = RandomFloats(q_elems, seed, 1.0f, true);
    k = RandomFloats(kv_elems, seed + 1, 1.0f, true);
    v = RandomFloats(kv_elems, seed + 2, 1.0f, true);
    hq = q.data();
    hk = k.data();
    hv = v.data();
  }
  DeviceBuffer<__nv_bfloat16> dq_in(q_elems), dk_in(c.fused_qkv ? 1 : kv_elems),
      dv_in(c.fused_qkv ? 1 : kv_elems);
  if (c.fused_qkv) {
    dq_in.Upload(ToBf16(qkv));
  } else {
    dq_in.Upload(ToBf16(q));
    dk_in.Upload(ToBf16(k));
    dv_in.Upload(ToBf16(v));
  }
  const __nv_bfloat16* q_dev = dq_in.get();
  const __nv_bfloat16* k_dev = c.fused_qkv ? dq_in.get() + c.heads * c.head_dim : dk_in.get();
  const __nv_bfloat16* v_dev = c.fused_qkv ? k_dev + c.kv_heads * c.head_dim : dv_in.get();

  DeviceBuffer<__nv_bfloat16> out(o_elems);
  DeviceBuffer<float> lse(c.batch * c.heads * c.seq_q);
  out.Poison();
  lse.Poison();
  LAUNCH_OK(kernels::cuda::AttentionForward(d, q_dev, k_dev, v_dev, out.get(), lse.get(), nullptr, c.block_m));

  std::vector<float> ref_out(o_elems), ref_lse(lse.size());
  kernels::reference::AttentionForward(d, hq, hk, hv, ref_out.data(), ref_lse.data());
  std::vector<float> got_out = FromBf16(out.Download()), got_lse = lse.Download();
  double lse_err = 0;
  for (size_t i = 0; i < got_lse.size(); ++i) {
    if (std::isinf(ref_lse[i])) {  // fully masked row: kernel convention is +inf and zeros
      CHECK(got_lse[i] == std::numeric_limits<float>::infinity(), "masked row " << i << " lse " << got_lse[i]);
      continue;
    }
    CHECK(std::isfinite(got_lse[i]), "lse[" << i << "] = " << got_lse[i]);
    lse_err = std::max(lse_err, std::fabs(static_cast<double>(got_lse[i]) - ref_lse[i]));
  }
  std::printf("    %-28s max abs err %.3e (tol 2e-3)\n", "lse", lse_err);
  CHECK(lse_err <= 2e-3, "lse error " << lse_err);
  ExpectClose("out", got_out, ref_out, 1e-2);
  if (!check_backward) return;

  const std::vector<float> d_out = RandomFloats(o_elems, seed + 3, 1.0f, true);
  DeviceBuffer<__nv_bfloat16> d_out_dev(o_elems);
  d_out_dev.Upload(ToBf16(d_out));
  DeviceBuffer<__nv_bfloat16> gq(q_elems), gk(c.fused_qkv ? 1 : kv_elems), gv(c.fused_qkv ? 1 : kv_elems);
  gq.Poison();
  gk.Poison();
  gv.Poison();
  __nv_bfloat16* gq_dev = gq.get();
  __nv_bfloat16* gk_dev = c.fused_qkv ? gq.get() + c.heads * c.head_dim : gk.get();
  __nv_bfloat16* gv_dev = c.fused_qkv ? gk_dev + c.kv_heads * c.head_dim : gv.get();
  DeviceBuffer<unsigned char> ws(kernels::cuda::AttentionBackwardWorkspaceBytes(d));
  ws.Poison();
  LAUNCH_OK(kernels::cuda::AttentionBackward(d, q_dev, k_dev, v_dev, out.get(), lse.get(), d_out_dev.get(), gq_dev,
                                             gk_dev, gv_dev, ws.get(), nullptr));
  std::vector<float> ref_dq(q_elems, 0.f), ref_dk(c.fused_qkv ? q_elems : kv_elems, 0.f),
      ref_dv(c.fused_qkv ? q_elems : kv_elems, 0.f);
  if (c.fused_qkv) {
    // One buffer holds all three gradients; the reference writes each slice.
    std::vector<float> fused(q_elems, 0.f);
    kernels::reference::AttentionBackward(d, hq, hk, hv, d_out.data(), fused.data(),
                                          fused.data() + c.heads * c.head_dim,
                                          fused.data() + (c.heads + c.kv_heads) * c.head_dim);
    ExpectClose("dqkv (fused)", FromBf16(gq.Download()), fused, 2e-2);
    return;
  }
  kernels::reference::AttentionBackward(d, hq, hk, hv, d_out.data(), ref_dq.data(), ref_dk.data(), ref_dv.data());
  ExpectClose("dq", FromBf16(gq.Download()), ref_dq, 2e-2);
  ExpectClose("dk", FromBf16(gk.Download()), ref_dk, 2e-2);
  ExpectClose("dv", FromBf16(gv.Download()), ref_dv, 2e-2);
}

GPU_TEST(AttentionCausalHeadDim128) {
  RunCase({2, 256, 256, 4, 4, 128, true}, true, 10);
  RunCase({2, 256, 256, 4, 4, 128, true, 0, 0, false, 64}, false, 11);
}

GPU_TEST(AttentionFullGqaRaggedHeadDim64) { RunCase({1, 200, 200, 4, 2, 64, false}, true, 20); }

GPU_TEST(AttentionFullCrossLengthsHeadDim128) { RunCase({2, 130, 300, 6, 2, 128, false}, true, 30); }

GPU_TEST(AttentionCausalShiftedWindows) {
  // Ring-attention shards: queries after the keys (shift > 0) and before them
  // (shift < 0, the first rows see nothing).
  RunCase({1, 130, 300, 6, 2, 128, true, 170, 0}, true, 40);
  RunCase({1, 100, 100, 2, 1, 64, true, 0, 40}, true, 41);
}

GPU_TEST(AttentionFusedQkvStridesGqa) { RunCase({2, 192, 192, 8, 2, 128, true, 0, 0, true}, true, 50); }

GPU_TEST(AttentionRejectsUnsupportedDims) {
  Case c{1, 64, 64, 4, 4, 96, true};
  AttentionDims d = DimsOf(c);
  DeviceBuffer<__nv_bfloat16> buf(64 * 4 * 128 * 3);
  DeviceBuffer<float> lse(256);
  CHECK(kernels::cuda::AttentionForward(d, buf.get(), buf.get(), buf.get(), buf.get(), lse.get(), nullptr) ==
            cudaErrorInvalidValue,
        "head_dim 96 must be rejected");
  d.head_dim = 128;
  d.num_kv_heads = 3;
  CHECK(kernels::cuda::AttentionForward(d, buf.get(), buf.get(), buf.get(), buf.get(), lse.get(), nullptr) ==
            cudaErrorInvalidValue,
        "4 heads over 3 kv heads must be rejected");
}

}  // namespace
}  // namespace loom::gpu_test
