// Attention forward, FlashAttention-2 style on mma.sync (m16n8k16 bf16):
// one CTA per (query block, query head, batch); each warp owns 16 query rows
// and keeps Q's fragments, the output accumulator and its softmax state in
// registers while K/V tiles stream through double-buffered shared memory
// (cp.async). The score tile never leaves registers.
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/hd/mma_layout.h"
#include "kernels/cuda/hd/online_softmax.h"

namespace loom::kernels::cuda {
namespace {

template <int kD, int kBM, int kBN>
struct FwdConfig {
  static constexpr int kWarps = kBM / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSmemBytes = (kBM * kD + 4 * kBN * kD) * 2;  // Q + 2 x (K, V)
};

template <int kD, int kBM, int kBN>
__global__ void __launch_bounds__(FwdConfig<kD, kBM, kBN>::kThreads)
    AttentionFwdKernel(const AttentionParams p) {
  using Cfg = FwdConfig<kD, kBM, kBN>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* s_q = reinterpret_cast<bf16*>(smem_raw);
  bf16* s_k = s_q + kBM * kD;       // two buffers of kBN x kD
  bf16* s_v = s_k + 2 * kBN * kD;   // two buffers of kBN x kD

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Heaviest causal blocks (the last queries) first, for a better tail.
  const int q_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = KvHeadOf(head, p.heads_q, p.heads_kv);
  const bf16* q_base = p.q + static_cast<int64_t>(batch) * p.seq_q * p.q_stride + head * kD;
  const bf16* k_base = p.k + static_cast<int64_t>(batch) * p.seq_kv * p.k_stride + kv_head * kD;
  const bf16* v_base = p.v + static_cast<int64_t>(batch) * p.seq_kv * p.v_stride + kv_head * kD;
  const BlockRange range = AttentionKvBlocks(q_block, kBM, kBN, p.seq_kv, p.causal, p.shift);

  LoadTileAsync<kBM, kD, Cfg::kThreads>(s_q, q_base, q_block * kBM, p.seq_q, p.q_stride, tid);
  if (range.end > range.begin) {
    LoadTileAsync<kBN, kD, Cfg::kThreads>(s_k, k_base, range.begin * kBN, p.seq_kv, p.k_stride, tid);
    LoadTileAsync<kBN, kD, Cfg::kThreads>(s_v, v_base, range.begin * kBN, p.seq_kv, p.v_stride, tid);
  }
  CpAsyncCommit();

  uint32_t q_frag[kD / 16][4];
  float o_acc[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // log2 domain; rows g and g + 8 of the warp
  float row_sum[2] = {0.f, 0.f};              // this thread's partial sums
  const int warp_row0 = q_block * kBM + warp * 16;

  for (int n = range.begin; n < range.end; ++n) {
    const int buf = (n - range.begin) & 1;
    if (n + 1 < range.end) {
      const int nb = buf ^ 1;
      LoadTileAsync<kBN, kD, Cfg::kThreads>(s_k + nb * kBN * kD, k_base, (n + 1) * kBN, p.seq_kv, p.k_stride, tid);
      LoadTileAsync<kBN, kD, Cfg::kThreads>(s_v + nb * kBN * kD, v_base, (n + 1) * kBN, p.seq_kv, p.v_stride, tid);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    if (n == range.begin) {
      const RowCol a = LdmatrixA(lane);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        Ldmatrix4(q_frag[kk], s_q + SwizzledOffset16(warp * 16 + a.row, kk * 16 + a.col, kD));
    }
    const bf16* k_tile = s_k + buf * kBN * kD;
    const bf16* v_tile = s_v + buf * kBN * kD;

    // S = Q K^T for this warp's 16 rows x kBN keys.
    float s[kBN / 8][4];
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    {
      const RowCol bk = LdmatrixBNk(lane);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
        for (int np = 0; np < kBN / 16; ++np) {
          uint32_t b[4];
          Ldmatrix4(b, k_tile + SwizzledOffset16(np * 16 + bk.row, kk * 16 + bk.col, kD));
          MmaBf16(s[2 * np], q_frag[kk], b[0], b[1]);
          MmaBf16(s[2 * np + 1], q_frag[kk], b[2], b[3]);
        }
    }
    if (AttentionTileNeedsMask(q_block, n, kBM, kBN, p.seq_kv, p.causal, p.shift)) {
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const RowCol e = MmaAccElement(lane, i);
          if (AttentionMasked(warp_row0 + e.row, n * kBN + nt * 8 + e.col, p.seq_kv, p.causal, p.shift))
            s[nt][i] = -INFINITY;
        }
    }

    // Online softmax: new max, rescale what was accumulated, P = exp2(S' - ref).
    float rescale[2], ref[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) m = fmaxf(m, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
      m = QuadMax(m) * p.scale_log2;  // scale > 0 commutes with max; -inf stays -inf
      rescale[h] = OnlineSoftmaxRescale(&row_max[h], m);
      ref[h] = SoftmaxReference(row_max[h]);
      row_sum[h] *= rescale[h];
    }
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float e = exp2f(fmaf(s[nt][i], p.scale_log2, -ref[i / 2]));
        s[nt][i] = e;
        row_sum[i / 2] += e;
      }
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      o_acc[dt][0] *= rescale[0];
      o_acc[dt][1] *= rescale[0];
      o_acc[dt][2] *= rescale[1];
      o_acc[dt][3] *= rescale[1];
    }

    // O += P V: P's accumulator pairs are already A fragments.
    {
      const RowCol bv = LdmatrixBKnTrans(lane);
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t a[4];
        a[0] = PackBf16(s[2 * kk][0], s[2 * kk][1]);
        a[1] = PackBf16(s[2 * kk][2], s[2 * kk][3]);
        a[2] = PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < kD / 16; ++dp) {
          uint32_t b[4];
          Ldmatrix4Trans(b, v_tile + SwizzledOffset16(kk * 16 + bv.row, dp * 16 + bv.col, kD));
          MmaBf16(o_acc[2 * dp], a, b[0], b[1]);
          MmaBf16(o_acc[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  CpAsyncWait<0>();  // an empty range still committed the Q group

  // Epilogue: normalize, write O (bf16) and the natural-log LSE.
  bf16* o_base = p.out + static_cast<int64_t>(batch) * p.seq_q * p.o_stride + head * kD;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = QuadSum(row_sum[h]);
    const float inv = SoftmaxInvSum(sum);
    const int row = warp_row0 + (lane / 4) + 8 * h;
    if (row < p.seq_q) {
      bf16* dst = o_base + static_cast<int64_t>(row) * p.o_stride + 2 * (lane % 4);
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt)
        *reinterpret_cast<uint32_t*>(dst + dt * 8) = PackBf16(o_acc[dt][2 * h] * inv, o_acc[dt][2 * h + 1] * inv);
      if (lane % 4 == 0)
        p.lse[(static_cast<int64_t>(batch) * p.heads_q + head) * p.seq_q + row] = SoftmaxLse(row_max[h], sum);
    }
  }
}

template <int kD, int kBM, int kBN>
cudaError_t LaunchFwd(const AttentionParams& p, cudaStream_t stream) {
  using Cfg = FwdConfig<kD, kBM, kBN>;
  auto kernel = AttentionFwdKernel<kD, kBM, kBN>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  dim3 grid(CeilDiv(p.seq_q, kBM), p.heads_q, p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t AttentionForward(const AttentionDims& dims, const bf16* q, const bf16* k, const bf16* v,
                             bf16* out, float* lse, cudaStream_t stream, int block_m) {
  if (!AttentionDimsSupported(dims) || !Aligned16(q) || !Aligned16(k) || !Aligned16(v) ||
      !Aligned16(out) || lse == nullptr)
    return cudaErrorInvalidValue;
  if (block_m == 0) block_m = 128;
  AttentionParams p = MakeAttentionParams(dims);
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  if (dims.head_dim == 64) return block_m == 128 ? LaunchFwd<64, 128, 64>(p, stream) : cudaErrorInvalidValue;
  if (block_m == 128) return LaunchFwd<128, 128, 64>(p, stream);
  if (block_m == 64) return LaunchFwd<128, 64, 64>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace loom::kernels::cuda
