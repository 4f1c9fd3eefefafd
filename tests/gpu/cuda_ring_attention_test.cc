// Context parallelism's GPU path (docs/context_parallel.md), skipped with the
// reason where there is no CUDA device:
//  - CudaOps::AttentionMerge and CopyRows against CpuOps;
//  - ring attention's blocks on the device (RingBlocks over CudaOps, every
//    rank of a cp2 zigzag split simulated on one GPU) against the CPU's full
//    attention, within the bf16 attention tolerance of cuda_ops_test.cc;
//  - with two or more devices: RingAttention over an NCCL group (ranks as
//    threads, one device each), K/V sent and received in device memory.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/backend/cuda_ops.h"
#include "worker/engine/context_parallel/ring_attention.h"
#include "worker/engine/context_parallel/ring_blocks.h"
#if LOOM_RING_TEST_HAVE_NCCL
#include "worker/comm/in_process_store.h"
#include "worker/comm/nccl_communicator.h"
#endif

namespace loom::engine {
namespace {

using kernels::Buffer;
using kernels::cuda::CudaOps;

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::unique_ptr<CudaOps> MakeGpu(int device) {
  kernels::cuda::CudaOpsOptions o;
  o.device = device;
  o.abort_on_error = false;
  std::string why;
  auto ops = CudaOps::Create(o, &why);
  EXPECT_NE(ops, nullptr) << why;
  return ops;
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.5f, 1.5f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

Buffer Up(kernels::Ops& ops, const std::vector<float>& host) {
  Buffer b = ops.AllocateFloats(static_cast<int64_t>(host.size()));
  ops.CopyHostToDevice(b.data(), host.data(), b.bytes());
  return b;
}
std::vector<float> Down(kernels::Ops& ops, const float* p, int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  ops.CopyDeviceToHost(host.data(), p, n * static_cast<int64_t>(sizeof(float)));
  return host;
}

// max |diff| <= frac * max |want| + atol
void ExpectNormClose(const std::vector<float>& got, const std::vector<float>& want, double frac,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    max_ref = std::max(max_ref, std::fabs(double(want[i])));
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - want[i]));
  }
  EXPECT_LE(max_diff, frac * max_ref + 1e-3) << what << " (max |ref| " << max_ref << ")";
}

TEST(CudaRingAttention, MergeAndCopyRowsMatchTheCpu) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = MakeGpu(0);
  ASSERT_NE(gpu, nullptr);
  kernels::cpu::CpuOps cpu(1);
  const int64_t seq = 33, heads = 3, hd = 16, stride = heads * hd + 4;
  std::vector<float> out = Random(seq * stride, 1), blk = Random(seq * stride, 2);
  std::vector<float> lse = Random(heads * seq, 3), blse = Random(heads * seq, 4);
  lse[0] = -INFINITY;
  blse[5] = -INFINITY;
  {
    Buffer g_out = Up(*gpu, out), g_lse = Up(*gpu, lse), g_blk = Up(*gpu, blk),
           g_blse = Up(*gpu, blse), g_rows = gpu->AllocateFloats(seq * hd);
    gpu->AttentionMerge(seq, heads, hd, g_out.f32(), stride, g_lse.f32(), g_blk.f32(), stride,
                        g_blse.f32());
    gpu->CopyRows(seq, hd, g_blk.f32() + 3, stride, g_rows.f32(), hd);
    cpu.AttentionMerge(seq, heads, hd, out.data(), stride, lse.data(), blk.data(), stride,
                       blse.data());
    const std::vector<float> got_out = Down(*gpu, g_out.f32(), seq * stride),
                             got_lse = Down(*gpu, g_lse.f32(), heads * seq),
                             got_rows = Down(*gpu, g_rows.f32(), seq * hd);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(got_out[i], out[i], 1e-4) << i;
    for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(got_lse[i], lse[i], 1e-4) << i;
    for (int64_t r = 0; r < seq; ++r)
      for (int64_t e = 0; e < hd; ++e) ASSERT_EQ(got_rows[r * hd + e], blk[r * stride + 3 + e]);
  }
  EXPECT_TRUE(gpu->ok()) << gpu->error();
}

struct Problem {
  int cp = 2;
  int64_t batch = 1, seq = 160, heads = 4, kv_heads = 2, hd = 64;
  RingDims dims() const {
    RingDims d;
    d.batch = batch;
    d.heads = heads;
    d.kv_heads = kv_heads;
    d.head_dim = hd;
    d.causal = true;
    d.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    return d;
  }
  int64_t width() const { return (heads + 2 * kv_heads) * hd; }
};

// This rank's rows of a [batch, seq, w] tensor, zigzag order.
std::vector<float> RowsOf(const ZigzagSplit& z, int r, const std::vector<float>& t, int64_t batch,
                          int64_t w) {
  std::vector<float> local;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t p : z.Positions(r)) {
      const float* row = t.data() + (b * z.seq_len + p) * w;
      local.insert(local.end(), row, row + w);
    }
  return local;
}

// The CPU's full attention of the whole sequence: out and dqkv.
void FullAttention(const Problem& p, const std::vector<float>& qkv, const std::vector<float>& dout,
                   std::vector<float>* out, std::vector<float>* dqkv) {
  kernels::cpu::CpuOps cpu(2);
  kernels::AttentionDims a;
  a.batch = p.batch;
  a.seq_q = a.seq_kv = p.seq;
  a.num_heads = p.heads;
  a.num_kv_heads = p.kv_heads;
  a.head_dim = p.hd;
  a.causal = true;
  a.scale = p.dims().scale;
  a.q_row_stride = a.k_row_stride = a.v_row_stride = p.width();
  a.o_row_stride = p.heads * p.hd;
  const int64_t k = p.heads * p.hd, v = k + p.kv_heads * p.hd;
  out->assign(p.batch * p.seq * p.heads * p.hd, 0.0f);
  dqkv->assign(qkv.size(), 0.0f);
  std::vector<float> lse(p.batch * p.heads * p.seq);
  cpu.AttentionForward(a, qkv.data(), qkv.data() + k, qkv.data() + v, out->data(), lse.data());
  cpu.AttentionBackward(a, qkv.data(), qkv.data() + k, qkv.data() + v, out->data(), lse.data(),
                        dout.data(), dqkv->data(), dqkv->data() + k, dqkv->data() + v);
}

TEST(CudaRingAttention, BlocksOnTheDeviceEqualFullAttention) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = MakeGpu(0);
  ASSERT_NE(gpu, nullptr);
  const Problem p;
  auto z = ZigzagSplit::Make(p.seq, p.cp);
  ASSERT_TRUE(z.ok());
  const RingDims d = p.dims();
  const int64_t qw = d.q_width(), kw = d.kv_width();
  const std::vector<float> qkv = Random(p.batch * p.seq * p.width(), 7),
                           dout = Random(p.batch * p.seq * qw, 8);
  std::vector<float> out, dqkv;
  FullAttention(p, qkv, dout, &out, &dqkv);
  {
    // Each rank's q and K/V in the ring's layouts, on the device.
    std::vector<Buffer> q, kv, o, lse, dq, dkv, dov;
    for (int r = 0; r < p.cp; ++r) {
      const std::vector<float> rows = RowsOf(*z, r, qkv, p.batch, p.width());
      const int64_t n = p.batch * z->local_seq();
      std::vector<float> hq(n * qw), hkv(2 * n * kw);
      for (int64_t t = 0; t < n; ++t) {
        std::copy_n(rows.data() + t * p.width(), qw, hq.data() + t * qw);
        std::copy_n(rows.data() + t * p.width() + qw, kw, hkv.data() + t * kw);
        std::copy_n(rows.data() + t * p.width() + qw + kw, kw, hkv.data() + (n + t) * kw);
      }
      q.push_back(Up(*gpu, hq));
      kv.push_back(Up(*gpu, hkv));
      o.push_back(gpu->AllocateFloats(RingQFloats(d, *z)));
      lse.push_back(gpu->AllocateFloats(RingLseFloats(d, *z)));
      dq.push_back(Up(*gpu, std::vector<float>(RingQFloats(d, *z), 0.0f)));
      dkv.push_back(Up(*gpu, std::vector<float>(RingKvFloats(d, *z), 0.0f)));
      dov.push_back(Up(*gpu, RowsOf(*z, r, dout, p.batch, qw)));
    }
    for (int r = 0; r < p.cp; ++r) {
      RingBlocks blocks(*gpu, d, *z, r);
      blocks.BeginForward(o[r].f32(), lse[r].f32());
      for (int s = 0; s < p.cp; ++s) {
        const int owner = (r - s + p.cp) % p.cp;
        blocks.ForwardBlock(q[r].f32(), kv[owner].f32(), owner, o[r].f32(), lse[r].f32());
      }
      for (int s = 0; s < p.cp; ++s) {
        const int owner = (r - s + p.cp) % p.cp;
        blocks.BackwardBlock(q[r].f32(), kv[owner].f32(), owner, o[r].f32(), lse[r].f32(),
                             dov[r].f32(), dq[r].f32(), dkv[owner].f32());
      }
    }
    for (int r = 0; r < p.cp; ++r) {
      const int64_t n = p.batch * z->local_seq();
      ExpectNormClose(Down(*gpu, o[r].f32(), n * qw), RowsOf(*z, r, out, p.batch, qw), 0.03,
                      "ring out");
      const std::vector<float> want = RowsOf(*z, r, dqkv, p.batch, p.width());
      const std::vector<float> got_dq = Down(*gpu, dq[r].f32(), n * qw),
                               got_dkv = Down(*gpu, dkv[r].f32(), 2 * n * kw);
      std::vector<float> got(want.size()), want_cmp(want.size());
      for (int64_t t = 0; t < n; ++t) {
        std::copy_n(got_dq.data() + t * qw, qw, got.data() + t * p.width());
        std::copy_n(got_dkv.data() + t * kw, kw, got.data() + t * p.width() + qw);
        std::copy_n(got_dkv.data() + (n + t) * kw, kw, got.data() + t * p.width() + qw + kw);
      }
      ExpectNormClose(got, want, 0.03, "ring dq|dk|dv");
    }
  }
  EXPECT_TRUE(gpu->ok()) << gpu->error();
}

#if LOOM_RING_TEST_HAVE_NCCL
TEST(CudaRingAttention, RingOverNcclEqualsFullAttention) {
  if (DeviceCount() < 2) GTEST_SKIP() << "the NCCL ring needs two CUDA devices (one per rank)";
  const Problem p;
  auto z = ZigzagSplit::Make(p.seq, p.cp);
  ASSERT_TRUE(z.ok());
  const RingDims d = p.dims();
  const int64_t qw = d.q_width();
  const std::vector<float> qkv = Random(p.batch * p.seq * p.width(), 9),
                           dout = Random(p.batch * p.seq * qw, 10);
  std::vector<float> out, dqkv;
  FullAttention(p, qkv, dout, &out, &dqkv);
  comm::InProcessStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < p.cp; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      auto gpu = MakeGpu(r);
      ASSERT_NE(gpu, nullptr);
      comm::NcclOptions o;
      o.group_name = "cp";
      o.rank = r;
      o.size = p.cp;
      o.key_prefix = "test/ring/cp";
      o.timeout = absl::Seconds(60);
      o.device = r;
      o.compute_stream = gpu->stream();
      auto group = comm::CreateNcclCommunicator(store, o);
      ASSERT_TRUE(group.ok()) << group.status();
      {
        const int64_t n = p.batch * z->local_seq();
        Buffer lqkv = Up(*gpu, RowsOf(*z, r, qkv, p.batch, p.width()));
        Buffer ldo = Up(*gpu, RowsOf(*z, r, dout, p.batch, qw));
        Buffer lo = gpu->AllocateFloats(n * qw), llse = gpu->AllocateFloats(RingLseFloats(d, *z));
        Buffer ld = Up(*gpu, std::vector<float>(n * p.width(), 0.0f));
        RingAttention ring(*gpu, **group);
        ASSERT_TRUE(ring.Forward(d, *z, lqkv.f32(), p.width(), lo.f32(), llse.f32()).ok());
        ASSERT_TRUE(ring.Backward(d, *z, lqkv.f32(), p.width(), lo.f32(), llse.f32(), ldo.f32(),
                                  ld.f32())
                        .ok());
        gpu->Synchronize();
        ExpectNormClose(Down(*gpu, lo.f32(), n * qw), RowsOf(*z, r, out, p.batch, qw), 0.03,
                        "NCCL ring out");
        std::vector<float> got = Down(*gpu, ld.f32(), n * p.width());
        ExpectNormClose(got, RowsOf(*z, r, dqkv, p.batch, p.width()), 0.03, "NCCL ring dqkv");
      }
      EXPECT_TRUE(gpu->ok()) << gpu->error();
    });
  }
  for (auto& t : threads) t.join();
}
#endif

}  // namespace
}  // namespace loom::engine
