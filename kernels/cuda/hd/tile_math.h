// Tile arithmetic shared by the attention and GEMM kernels and their host
// tests: which key blocks a query block visits (and the converse for the
// backward pass), which tiles need masking, grouped-query head mapping, and
// the shared-memory swizzle that keeps ldmatrix/cp.async free of bank
// conflicts.
#pragma once

#include "kernels/cuda/hd/hd.h"

namespace loom::kernels::cuda {

LOOM_HD int CeilDiv(int a, int b) { return (a + b - 1) / b; }
LOOM_HD int MinInt(int a, int b) { return a < b ? a : b; }
LOOM_HD int MaxInt(int a, int b) { return a > b ? a : b; }

// Half-open range [begin, end) of block indices.
struct BlockRange {
  int begin;
  int end;
};

// Causal masking: key j is visible to query i iff j <= i + shift, with shift =
// q_offset - kv_offset the distance between the first query's and the first
// key's absolute positions (0 for ordinary self-attention: top-left aligned,
// as torch's scaled_dot_product_attention(is_causal=True)).
LOOM_HD bool AttentionMasked(int q_row, int k_col, int seq_kv, bool causal, int shift) {
  return k_col >= seq_kv || (causal && k_col > q_row + shift);
}

// Floor division for a possibly negative numerator.
LOOM_HD int FloorDiv(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Key blocks that query block q_block must visit.
LOOM_HD BlockRange AttentionKvBlocks(int q_block, int block_m, int block_n, int seq_kv,
                                     bool causal, int shift) {
  int end = CeilDiv(seq_kv, block_n);
  if (causal) end = MinInt(end, FloorDiv((q_block + 1) * block_m - 1 + shift, block_n) + 1);
  return BlockRange{0, MaxInt(end, 0)};
}

// Query blocks that see key block kv_block (backward pass, one CTA per key
// block).
LOOM_HD BlockRange AttentionQBlocks(int kv_block, int block_m, int block_n, int seq_q,
                                    bool causal, int shift) {
  int end = CeilDiv(seq_q, block_m);
  int begin = 0;
  if (causal) begin = MinInt(FloorDiv(MaxInt(kv_block * block_n - shift, 0), block_m), end);
  return BlockRange{begin, end};
}

// Whether any score of the tile is masked: the key tail of the sequence, or
// (causal) a key beyond what the tile's first query row sees. Tiles that need
// no mask skip the per-element test.
LOOM_HD bool AttentionTileNeedsMask(int q_block, int kv_block, int block_m, int block_n,
                                    int seq_kv, bool causal, int shift) {
  int last_key = (kv_block + 1) * block_n - 1;
  if (last_key >= seq_kv) return true;
  return causal && last_key > q_block * block_m + shift;
}

// Grouped-query attention: query heads [g * group, (g + 1) * group) share key
// and value head g.
LOOM_HD int KvHeadOf(int q_head, int heads_q, int heads_kv) {
  return q_head / (heads_q / heads_kv);
}

// Shared-memory tiles are rows of 16-byte chunks; chunk c of row r is stored at
// chunk c ^ (r % 8). The 8 rows an ldmatrix phase reads (same logical chunk)
// then hit 8 different 16-byte bank groups. Needs at least 8 chunks per row.
LOOM_HD int SwizzleChunk(int row, int chunk) { return chunk ^ (row & 7); }

// Element offset of (row, col) in a swizzled tile of 2-byte elements with
// `cols` elements per row (8 per chunk).
LOOM_HD int SwizzledOffset16(int row, int col, int cols) {
  return row * cols + SwizzleChunk(row, col >> 3) * 8 + (col & 7);
}

// Same for 1-byte elements (16 per chunk), as the FP8 tiles are stored.
LOOM_HD int SwizzledOffset8(int row, int col, int cols) {
  return row * cols + SwizzleChunk(row, col >> 4) * 16 + (col & 15);
}

}  // namespace loom::kernels::cuda
