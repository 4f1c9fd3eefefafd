// Attention backward, FlashAttention-2 style on mma.sync: one CTA per (key
// block, kv head, batch) keeps dK and dV in registers and walks every query
// block of every query head of its group (so GQA's sum over the group needs
// no atomics), recomputing P = exp(S - LSE) tile by tile. P and dS live only
// in shared memory; dQ is accumulated in fp32 with atomics and converted at
// the end. Q/dO tiles are double-buffered (cp.async).
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/hd/mma_layout.h"
#include "kernels/cuda/hd/online_softmax.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kBwdBM = 64;  // query rows per tile
constexpr int kBwdBN = 64;  // keys per CTA
constexpr int kBwdWarps = 8;
constexpr int kBwdThreads = kBwdWarps * 32;

template <int kD>
constexpr int BwdSmemBytes() {
  // K, V, 2 x (Q, dO), P, dS
  return (2 * kBwdBN * kD + 4 * kBwdBM * kD + 2 * kBwdBM * kBwdBN) * 2;
}

// D[b, h, i] = sum_d dO * O, one warp per (token, head); zeroes dq_accum.
template <int kD>
__global__ void AttentionBwdPreprocess(const AttentionParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.seq_q * p.heads_q;
  if (row >= rows) return;
  const int head = static_cast<int>(row % p.heads_q);
  const int64_t token = row / p.heads_q;  // batch * seq_q + i
  const bf16* o = p.o + token * p.o_stride + head * kD;
  const bf16* d_o = p.d_o + token * p.o_stride + head * kD;
  float acc = 0.f;
#pragma unroll
  for (int c = lane * 2; c < kD; c += 64) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(o + c));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(d_o + c));
    acc += a.x * b.x + a.y * b.y;
  }
  acc = WarpSum(acc);
  const int64_t batch = token / p.seq_q, i = token % p.seq_q;
  if (lane == 0) p.dvec[(batch * p.heads_q + head) * p.seq_q + i] = acc;
  float* dq = p.dq_accum + row * kD;
  for (int c = lane; c < kD; c += 32) dq[c] = 0.f;
}

template <int kD>
__global__ void __launch_bounds__(kBwdThreads) AttentionBwdKernel(const AttentionParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* s_k = reinterpret_cast<bf16*>(smem_raw);
  bf16* s_v = s_k + kBwdBN * kD;
  bf16* s_q = s_v + kBwdBN * kD;        // 2 buffers
  bf16* s_do = s_q + 2 * kBwdBM * kD;   // 2 buffers
  bf16* s_p = s_do + 2 * kBwdBM * kD;   // [BM][BN]
  bf16* s_ds = s_p + kBwdBM * kBwdBN;   // [BM][BN]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int kv_block = blockIdx.x, kv_head = blockIdx.y, batch = blockIdx.z;
  const int group = p.heads_q / p.heads_kv;
  const bf16* k_base = p.k + static_cast<int64_t>(batch) * p.seq_kv * p.k_stride + kv_head * kD;
  const bf16* v_base = p.v + static_cast<int64_t>(batch) * p.seq_kv * p.v_stride + kv_head * kD;
  const BlockRange qr = AttentionQBlocks(kv_block, kBwdBM, kBwdBN, p.seq_q, p.causal, p.shift);
  const int q_count = qr.end - qr.begin;
  const int items = group * q_count;  // (head in group, query block) pairs

  auto load_item = [&](int item, int buf) {
    const int head = kv_head * group + item / q_count;
    const int m = qr.begin + item % q_count;
    const int64_t q_off = static_cast<int64_t>(batch) * p.seq_q * p.q_stride + head * kD;
    const int64_t o_off = static_cast<int64_t>(batch) * p.seq_q * p.o_stride + head * kD;
    LoadTileAsync<kBwdBM, kD, kBwdThreads>(s_q + buf * kBwdBM * kD, p.q + q_off, m * kBwdBM, p.seq_q, p.q_stride, tid);
    LoadTileAsync<kBwdBM, kD, kBwdThreads>(s_do + buf * kBwdBM * kD, p.d_o + o_off, m * kBwdBM, p.seq_q, p.o_stride, tid);
  };

  LoadTileAsync<kBwdBN, kD, kBwdThreads>(s_k, k_base, kv_block * kBwdBN, p.seq_kv, p.k_stride, tid);
  LoadTileAsync<kBwdBN, kD, kBwdThreads>(s_v, v_base, kv_block * kBwdBN, p.seq_kv, p.v_stride, tid);
  if (items > 0) load_item(0, 0);
  CpAsyncCommit();

  // Warp tiling. Step 1 (S, dP: BM x BN): rows (warp % 4) * 16, keys
  // (warp / 4) * 32. Steps 2-4 (dV, dK: BN x D; dQ: BM x D): rows
  // (warp % 4) * 16, head-dim columns (warp / 4) * D / 2.
  constexpr int kDN = kD / 2 / 8;  // n-tiles of a warp's head-dim half
  const int r0 = (warp % 4) * 16;
  const int c0 = (warp / 4) * 32;
  const int d0 = (warp / 4) * (kD / 2);
  float dk_acc[kDN][4], dv_acc[kDN][4];
#pragma unroll
  for (int i = 0; i < kDN; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) dk_acc[i][j] = dv_acc[i][j] = 0.f;

  for (int item = 0; item < items; ++item) {
    const int buf = item & 1;
    const int head = kv_head * group + item / q_count;
    const int m = qr.begin + item % q_count;
    if (item + 1 < items) {
      load_item(item + 1, buf ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    // Per-row LSE (log2 units) and D for this thread's two accumulator rows.
    float lse2[2], dval[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m * kBwdBM + r0 + lane / 4 + 8 * h;
      const int64_t idx = (static_cast<int64_t>(batch) * p.heads_q + head) * p.seq_q + row;
      lse2[h] = row < p.seq_q ? p.lse[idx] * 1.4426950408889634f : INFINITY;
      dval[h] = row < p.seq_q ? p.dvec[idx] : 0.f;
    }
    __syncthreads();
    const bf16* q_tile = s_q + buf * kBwdBM * kD;
    const bf16* do_tile = s_do + buf * kBwdBM * kD;

    // Step 1: S = Q K^T and dP = dO V^T on the warp's 16 x 32 sub-tile.
    {
      float s[4][4], dp[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] = dp[i][j] = 0.f;
      const RowCol a_rc = LdmatrixA(lane), b_rc = LdmatrixBNk(lane);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t aq[4], ado[4];
        Ldmatrix4(aq, q_tile + SwizzledOffset16(r0 + a_rc.row, kk * 16 + a_rc.col, kD));
        Ldmatrix4(ado, do_tile + SwizzledOffset16(r0 + a_rc.row, kk * 16 + a_rc.col, kD));
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t b[4];
          Ldmatrix4(b, s_k + SwizzledOffset16(c0 + np * 16 + b_rc.row, kk * 16 + b_rc.col, kD));
          MmaBf16(s[2 * np], aq, b[0], b[1]);
          MmaBf16(s[2 * np + 1], aq, b[2], b[3]);
          Ldmatrix4(b, s_v + SwizzledOffset16(c0 + np * 16 + b_rc.row, kk * 16 + b_rc.col, kD));
          MmaBf16(dp[2 * np], ado, b[0], b[1]);
          MmaBf16(dp[2 * np + 1], ado, b[2], b[3]);
        }
      }
      const bool needs_mask =
          AttentionTileNeedsMask(m, kv_block, kBwdBM, kBwdBN, p.seq_kv, p.causal, p.shift);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        float pv[4], dsv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const RowCol e = MmaAccElement(lane, i);
          float prob = exp2f(fmaf(s[nt][i], p.scale_log2, -lse2[i / 2]));
          if (needs_mask && AttentionMasked(m * kBwdBM + r0 + e.row, kv_block * kBwdBN + c0 + nt * 8 + e.col,
                                            p.seq_kv, p.causal, p.shift))
            prob = 0.f;
          pv[i] = prob;
          dsv[i] = prob * (dp[nt][i] - dval[i / 2]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const RowCol e = MmaAccElement(lane, 2 * h);
          const int off = SwizzledOffset16(r0 + e.row, c0 + nt * 8 + e.col, kBwdBN);
          *reinterpret_cast<uint32_t*>(s_p + off) = PackBf16(pv[2 * h], pv[2 * h + 1]);
          *reinterpret_cast<uint32_t*>(s_ds + off) = PackBf16(dsv[2 * h], dsv[2 * h + 1]);
        }
      }
    }
    __syncthreads();

    // Steps 2 and 3: dV += P^T dO, dK += dS^T Q (A operands transposed out of
    // the [query][key] tiles by ldmatrix.trans).
    {
      const RowCol at = LdmatrixATrans(lane), bt = LdmatrixBKnTrans(lane);
#pragma unroll
      for (int kk = 0; kk < kBwdBM / 16; ++kk) {
        uint32_t ap[4], ads[4];
        Ldmatrix4Trans(ap, s_p + SwizzledOffset16(kk * 16 + at.row, r0 + at.col, kBwdBN));
        Ldmatrix4Trans(ads, s_ds + SwizzledOffset16(kk * 16 + at.row, r0 + at.col, kBwdBN));
#pragma unroll
        for (int np = 0; np < kDN / 2; ++np) {
          uint32_t b[4];
          Ldmatrix4Trans(b, do_tile + SwizzledOffset16(kk * 16 + bt.row, d0 + np * 16 + bt.col, kD));
          MmaBf16(dv_acc[2 * np], ap, b[0], b[1]);
          MmaBf16(dv_acc[2 * np + 1], ap, b[2], b[3]);
          Ldmatrix4Trans(b, q_tile + SwizzledOffset16(kk * 16 + bt.row, d0 + np * 16 + bt.col, kD));
          MmaBf16(dk_acc[2 * np], ads, b[0], b[1]);
          MmaBf16(dk_acc[2 * np + 1], ads, b[2], b[3]);
        }
      }
    }

    // Step 4: dQ (this tile's share) = dS K, added into the fp32 accumulator.
    {
      float dq[kDN][4];
#pragma unroll
      for (int i = 0; i < kDN; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
      const RowCol a_rc = LdmatrixA(lane), bt = LdmatrixBKnTrans(lane);
#pragma unroll
      for (int kk = 0; kk < kBwdBN / 16; ++kk) {
        uint32_t a[4];
        Ldmatrix4(a, s_ds + SwizzledOffset16(r0 + a_rc.row, kk * 16 + a_rc.col, kBwdBN));
#pragma unroll
        for (int np = 0; np < kDN / 2; ++np) {
          uint32_t b[4];
          Ldmatrix4Trans(b, s_k + SwizzledOffset16(kk * 16 + bt.row, d0 + np * 16 + bt.col, kD));
          MmaBf16(dq[2 * np], a, b[0], b[1]);
          MmaBf16(dq[2 * np + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m * kBwdBM + r0 + lane / 4 + 8 * h;
        if (row < p.seq_q) {
          float* dst = p.dq_accum +
                       ((static_cast<int64_t>(batch) * p.seq_q + row) * p.heads_q + head) * kD + d0 + 2 * (lane % 4);
#pragma unroll
          for (int nt = 0; nt < kDN; ++nt) {
            atomicAdd(dst + nt * 8, dq[nt][2 * h]);
            atomicAdd(dst + nt * 8 + 1, dq[nt][2 * h + 1]);
          }
        }
      }
    }
    __syncthreads();  // tiles of this item are free for the prefetch after next
  }
  CpAsyncWait<0>();

  // dK = scale * sum dS^T Q, dV = sum P^T dO; rows are keys.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = kv_block * kBwdBN + r0 + lane / 4 + 8 * h;
    if (key >= p.seq_kv) continue;
    bf16* dk = p.dk + (static_cast<int64_t>(batch) * p.seq_kv + key) * p.k_stride + kv_head * kD + d0 + 2 * (lane % 4);
    bf16* dv = p.dv + (static_cast<int64_t>(batch) * p.seq_kv + key) * p.v_stride + kv_head * kD + d0 + 2 * (lane % 4);
#pragma unroll
    for (int nt = 0; nt < kDN; ++nt) {
      *reinterpret_cast<uint32_t*>(dk + nt * 8) =
          PackBf16(dk_acc[nt][2 * h] * p.scale, dk_acc[nt][2 * h + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv + nt * 8) = PackBf16(dv_acc[nt][2 * h], dv_acc[nt][2 * h + 1]);
    }
  }
}

// dq = bf16(scale * dq_accum), 8 elements per thread.
template <int kD>
__global__ void AttentionBwdConvertDq(const AttentionParams p) {
  const int64_t idx = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  const int64_t total = static_cast<int64_t>(p.batch) * p.seq_q * p.heads_q * kD;
  if (idx >= total) return;
  const int64_t token = idx / (static_cast<int64_t>(p.heads_q) * kD);
  const int64_t within = idx % (static_cast<int64_t>(p.heads_q) * kD);
  const float4 a = *reinterpret_cast<const float4*>(p.dq_accum + idx);
  const float4 b = *reinterpret_cast<const float4*>(p.dq_accum + idx + 4);
  uint4 out;
  out.x = PackBf16(a.x * p.scale, a.y * p.scale);
  out.y = PackBf16(a.z * p.scale, a.w * p.scale);
  out.z = PackBf16(b.x * p.scale, b.y * p.scale);
  out.w = PackBf16(b.z * p.scale, b.w * p.scale);
  *reinterpret_cast<uint4*>(p.dq + token * p.q_stride + within) = out;
}

template <int kD>
cudaError_t LaunchBwd(const AttentionParams& p, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.seq_q * p.heads_q;
  AttentionBwdPreprocess<kD><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  auto kernel = AttentionBwdKernel<kD>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, BwdSmemBytes<kD>());
  if (attr != cudaSuccess) return attr;
  dim3 grid(CeilDiv(p.seq_kv, kBwdBN), p.heads_kv, p.batch);
  kernel<<<grid, kBwdThreads, BwdSmemBytes<kD>(), stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t vec = rows * kD / 8;
  AttentionBwdConvertDq<kD><<<static_cast<unsigned>((vec + 255) / 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

size_t RoundUp256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

size_t AttentionBackwardWorkspaceBytes(const AttentionDims& d) {
  const size_t rows = static_cast<size_t>(d.batch * d.seq_q * d.num_heads);
  return RoundUp256(rows * static_cast<size_t>(d.head_dim) * sizeof(float)) + RoundUp256(rows * sizeof(float));
}

cudaError_t AttentionBackward(const AttentionDims& dims, const bf16* q, const bf16* k, const bf16* v,
                              const bf16* out, const float* lse, const bf16* d_out, bf16* dq, bf16* dk,
                              bf16* dv, void* workspace, cudaStream_t stream) {
  if (!AttentionDimsSupported(dims)) return cudaErrorInvalidValue;
  for (const void* ptr : {static_cast<const void*>(q), static_cast<const void*>(k), static_cast<const void*>(v),
                          static_cast<const void*>(out), static_cast<const void*>(d_out),
                          static_cast<const void*>(dq), static_cast<const void*>(dk),
                          static_cast<const void*>(dv), static_cast<const void*>(workspace)})
    if (!Aligned16(ptr)) return cudaErrorInvalidValue;
  if (lse == nullptr) return cudaErrorInvalidValue;
  AttentionParams p = MakeAttentionParams(dims);
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = out;
  p.d_o = d_out;
  p.lse = const_cast<float*>(lse);
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  const size_t rows = static_cast<size_t>(dims.batch * dims.seq_q * dims.num_heads);
  p.dq_accum = static_cast<float*>(workspace);
  p.dvec = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                    RoundUp256(rows * static_cast<size_t>(dims.head_dim) * sizeof(float)));
  return dims.head_dim == 64 ? LaunchBwd<64>(p, stream) : LaunchBwd<128>(p, stream);
}

}  // namespace loom::kernels::cuda
