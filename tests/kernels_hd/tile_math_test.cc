// Tile arithmetic against brute force: the block ranges the attention kernels
// visit cover every visible (query, key) pair, tiles declared mask-free hold no
// masked pair, and the shared-memory swizzle is a conflict-free permutation.
#include "kernels/cuda/hd/tile_math.h"

#include <gtest/gtest.h>

#include <set>

namespace loom::kernels::cuda {
namespace {

struct Case {
  int seq_q, seq_kv, block_m, block_n, shift;
  bool causal;
};

TEST(AttentionTiles, RangesCoverEveryVisiblePairAndMaskFreeTilesAreClean) {
  std::vector<Case> cases;
  for (int seq_q : {1, 5, 64, 100, 130})
    for (int seq_kv : {1, 7, 64, 129})
      for (int bm : {16, 64, 128})
        for (int bn : {32, 64})
          for (int shift : {0, 3, -5, 64})
            for (bool causal : {false, true}) cases.push_back({seq_q, seq_kv, bm, bn, shift, causal});
  for (const Case& c : cases) {
    int q_blocks = CeilDiv(c.seq_q, c.block_m), kv_blocks = CeilDiv(c.seq_kv, c.block_n);
    for (int qb = 0; qb < q_blocks; ++qb) {
      BlockRange r = AttentionKvBlocks(qb, c.block_m, c.block_n, c.seq_kv, c.causal, c.shift);
      ASSERT_GE(r.begin, 0);
      ASSERT_LE(r.end, kv_blocks);
      for (int kb = 0; kb < kv_blocks; ++kb) {
        bool any_visible = false, any_masked = false;
        for (int i = qb * c.block_m; i < (qb + 1) * c.block_m; ++i)
          for (int j = kb * c.block_n; j < (kb + 1) * c.block_n; ++j) {
            bool masked = AttentionMasked(i, j, c.seq_kv, c.causal, c.shift);
            if (!masked && i < c.seq_q) any_visible = true;
            if (masked) any_masked = true;
          }
        bool in_range = kb >= r.begin && kb < r.end;
        if (any_visible) {
          EXPECT_TRUE(in_range) << qb << " " << kb;
        }
        if (in_range && any_masked) {
          EXPECT_TRUE(AttentionTileNeedsMask(qb, kb, c.block_m, c.block_n, c.seq_kv, c.causal, c.shift));
        }
        BlockRange qr = AttentionQBlocks(kb, c.block_m, c.block_n, c.seq_q, c.causal, c.shift);
        if (any_visible) {
          EXPECT_TRUE(qb >= qr.begin && qb < qr.end) << qb << " " << kb;
        }
      }
    }
  }
}

TEST(AttentionTiles, CausalRangesSkipBlocksAboveTheDiagonal) {
  // seq 256, 64x64 tiles, no shift: query block b visits key blocks 0..b.
  for (int qb = 0; qb < 4; ++qb) {
    BlockRange r = AttentionKvBlocks(qb, 64, 64, 256, true, 0);
    EXPECT_EQ(r.begin, 0);
    EXPECT_EQ(r.end, qb + 1);
    BlockRange q = AttentionQBlocks(qb, 64, 64, 256, true, 0);
    EXPECT_EQ(q.begin, qb);
    EXPECT_EQ(q.end, 4);
  }
  EXPECT_FALSE(AttentionTileNeedsMask(3, 2, 64, 64, 256, true, 0));
  EXPECT_TRUE(AttentionTileNeedsMask(3, 3, 64, 64, 256, true, 0));
  EXPECT_FALSE(AttentionTileNeedsMask(0, 3, 64, 64, 256, false, 0));
  // Keys entirely after every query: nothing to visit.
  EXPECT_EQ(AttentionKvBlocks(0, 64, 64, 256, true, -100).end, 0);
}

TEST(AttentionTiles, GroupedQueryHeads) {
  EXPECT_EQ(KvHeadOf(0, 32, 8), 0);
  EXPECT_EQ(KvHeadOf(3, 32, 8), 0);
  EXPECT_EQ(KvHeadOf(4, 32, 8), 1);
  EXPECT_EQ(KvHeadOf(31, 32, 8), 7);
  EXPECT_EQ(KvHeadOf(5, 6, 6), 5);
}

TEST(Swizzle, IsAPermutationOfEachRowAndConflictFreeAcrossEightRows) {
  for (int cols : {64, 128}) {
    for (int row = 0; row < 64; ++row) {
      std::set<int> seen;
      for (int col = 0; col < cols; ++col) {
        int off = SwizzledOffset16(row, col, cols);
        EXPECT_EQ(off / cols, row);
        seen.insert(off);
      }
      EXPECT_EQ(static_cast<int>(seen.size()), cols);
    }
    // ldmatrix phase: 8 rows, the same logical chunk, must occupy 8 distinct
    // 16-byte bank groups (a 128-byte line holds 8 of them).
    for (int r0 = 0; r0 < 64; r0 += 8)
      for (int chunk = 0; chunk < cols / 8; ++chunk) {
        std::set<int> groups;
        for (int r = r0; r < r0 + 8; ++r) groups.insert((SwizzledOffset16(r, chunk * 8, cols) * 2 / 16) % 8);
        EXPECT_EQ(groups.size(), 8u);
      }
  }
  for (int row = 0; row < 16; ++row) {
    std::set<int> seen;
    for (int col = 0; col < 128; ++col) seen.insert(SwizzledOffset8(row, col, 128));
    EXPECT_EQ(seen.size(), 128u);
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
