// CudaOps attention: the fp32 API over the bf16 kernels of
// kernels/cuda/attention. Inputs are rounded to bf16 into packed scratch
// tensors (token stride = heads * head_dim, so the fused-QKV column slices
// are gathered once), the kernels accumulate in fp32, and the bf16 outputs
// are widened back into the caller's strided fp32 tensors; lse stays fp32.
// This is a precision step: attention is bf16-accurate (about 3 significant
// digits), not fp32.
#include <initializer_list>
#include <string>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/backend/cuda_ops.h"
#include "kernels/cuda/backend/simple_kernels.h"

namespace loom::kernels::cuda {
namespace {

struct Packed {
  int64_t rows, cols;
};
Packed QShape(const AttentionDims& d) { return {d.batch * d.seq_q, d.num_heads * d.head_dim}; }
Packed KvShape(const AttentionDims& d) {
  return {d.batch * d.seq_kv, d.num_kv_heads * d.head_dim};
}
int64_t Bf16Bytes(Packed p) { return p.rows * p.cols * static_cast<int64_t>(sizeof(__nv_bfloat16)); }

AttentionDims PackedDims(const AttentionDims& dims) {
  AttentionDims packed = dims;
  packed.q_row_stride = packed.o_row_stride = dims.num_heads * dims.head_dim;
  packed.k_row_stride = packed.v_row_stride = dims.num_kv_heads * dims.head_dim;
  return packed;
}

__nv_bfloat16* Bf16(const Buffer& b) { return static_cast<__nv_bfloat16*>(b.data()); }

}  // namespace

void CudaOps::AttentionForward(const AttentionDims& dims, const float* q, const float* k,
                               const float* v, float* out, float* lse) {
  const Packed qs = QShape(dims), kvs = KvShape(dims);
  Buffer q16 = Scratch(Bf16Bytes(qs), "AttentionForward");
  Buffer k16 = Scratch(Bf16Bytes(kvs), "AttentionForward");
  Buffer v16 = Scratch(Bf16Bytes(kvs), "AttentionForward");
  Buffer o16 = Scratch(Bf16Bytes(qs), "AttentionForward");
  if (q16.empty() || k16.empty() || v16.empty() || o16.empty()) return;
  const char* what = "AttentionForward (bf16 conversion)";
  if (!Check(simple::FloatToBf16(q, dims.q_row_stride, qs.rows, qs.cols, Bf16(q16), qs.cols, stream_), what) ||
      !Check(simple::FloatToBf16(k, dims.k_row_stride, kvs.rows, kvs.cols, Bf16(k16), kvs.cols, stream_), what) ||
      !Check(simple::FloatToBf16(v, dims.v_row_stride, kvs.rows, kvs.cols, Bf16(v16), kvs.cols, stream_), what))
    return;
  if (!Check(cuda::AttentionForward(PackedDims(dims), Bf16(q16), Bf16(k16), Bf16(v16), Bf16(o16),
                                    lse, stream_),
             "AttentionForward (head_dim must be 64 or 128)"))
    return;
  Check(simple::Bf16ToFloat(Bf16(o16), qs.cols, qs.rows, qs.cols, out, dims.o_row_stride, stream_),
        what);
}

void CudaOps::AttentionBackward(const AttentionDims& dims, const float* q, const float* k,
                                const float* v, const float* out, const float* lse,
                                const float* d_out, float* dq, float* dk, float* dv) {
  const Packed qs = QShape(dims), kvs = KvShape(dims);
  const AttentionDims packed = PackedDims(dims);
  const char* what = "AttentionBackward";
  Buffer q16 = Scratch(Bf16Bytes(qs), what), o16 = Scratch(Bf16Bytes(qs), what);
  Buffer do16 = Scratch(Bf16Bytes(qs), what), dq16 = Scratch(Bf16Bytes(qs), what);
  Buffer k16 = Scratch(Bf16Bytes(kvs), what), v16 = Scratch(Bf16Bytes(kvs), what);
  Buffer dk16 = Scratch(Bf16Bytes(kvs), what), dv16 = Scratch(Bf16Bytes(kvs), what);
  Buffer workspace =
      Scratch(static_cast<int64_t>(AttentionBackwardWorkspaceBytes(packed)), what);
  for (const Buffer* b : {&q16, &o16, &do16, &dq16, &k16, &v16, &dk16, &dv16})
    if (b->empty()) return;
  const char* conv = "AttentionBackward (bf16 conversion)";
  if (!Check(simple::FloatToBf16(q, dims.q_row_stride, qs.rows, qs.cols, Bf16(q16), qs.cols, stream_), conv) ||
      !Check(simple::FloatToBf16(out, dims.o_row_stride, qs.rows, qs.cols, Bf16(o16), qs.cols, stream_), conv) ||
      !Check(simple::FloatToBf16(d_out, dims.o_row_stride, qs.rows, qs.cols, Bf16(do16), qs.cols, stream_), conv) ||
      !Check(simple::FloatToBf16(k, dims.k_row_stride, kvs.rows, kvs.cols, Bf16(k16), kvs.cols, stream_), conv) ||
      !Check(simple::FloatToBf16(v, dims.v_row_stride, kvs.rows, kvs.cols, Bf16(v16), kvs.cols, stream_), conv))
    return;
  if (!Check(cuda::AttentionBackward(packed, Bf16(q16), Bf16(k16), Bf16(v16), Bf16(o16), lse,
                                     Bf16(do16), Bf16(dq16), Bf16(dk16), Bf16(dv16),
                                     workspace.data(), stream_),
             "AttentionBackward (head_dim must be 64 or 128)"))
    return;
  if (!Check(simple::Bf16ToFloat(Bf16(dq16), qs.cols, qs.rows, qs.cols, dq, dims.q_row_stride, stream_), conv) ||
      !Check(simple::Bf16ToFloat(Bf16(dk16), kvs.cols, kvs.rows, kvs.cols, dk, dims.k_row_stride, stream_), conv))
    return;
  Check(simple::Bf16ToFloat(Bf16(dv16), kvs.cols, kvs.rows, kvs.cols, dv, dims.v_row_stride, stream_),
        conv);
}

void CudaOps::AttentionMerge(int64_t seq, int64_t heads, int64_t head_dim, float* out,
                             int64_t out_row_stride, float* lse, const float* block_out,
                             int64_t block_row_stride, const float* block_lse) {
  Check(simple::AttentionMerge(seq, heads, head_dim, out, out_row_stride, lse, block_out,
                               block_row_stride, block_lse, stream_),
        "AttentionMerge");
}

void CudaOps::CopyRows(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                       float* dst, int64_t dst_stride) {
  Check(simple::ScaleAdd(rows, cols, 1.0f, src, src_stride, 0.0f, dst, dst_stride, stream_),
        "CopyRows");
}

}  // namespace loom::kernels::cuda
