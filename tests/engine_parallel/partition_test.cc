// The flat partition of the data-parallel engine: bucket order and sizes,
// readiness, unit splits, shard ownership tiling every element once, pieces
// split at tensor boundaries, and flat ranges cut into rectangular slices.
#include <map>
#include <numeric>

#include "gtest/gtest.h"
#include "worker/engine/data_parallel/flat_partition.h"

namespace loom::engine {
namespace {

// Sizes 6 (unit 0), 10 and 4 (unit 1), 3 (unit 2), contiguous.
std::vector<FlatTensor> Tensors() {
  return {{"model.embed_tokens.weight", {2, 3}, 0, 6, 0},
          {"model.layers.0.a", {5, 2}, 6, 10, 1},
          {"model.layers.0.b", {4}, 16, 4, 1},
          {"model.norm.weight", {3}, 20, 3, 2}};
}

TEST(FlatPartitionTest, BucketsFromTheEndInLaunchOrder) {
  PartitionOptions o;
  o.ranks = 2;
  o.bucket_floats = 8;
  auto p = FlatPartition::Build(Tensors(), 3, o);
  ASSERT_TRUE(p.ok()) << p.status();
  // From the end: [norm 3 + b 4] = 7; a (10) alone (oversized); embed 6.
  ASSERT_EQ(p->buckets().size(), 3u);
  EXPECT_EQ(p->buckets()[0].begin, 16);
  EXPECT_EQ(p->buckets()[0].end, 23);
  EXPECT_EQ(p->buckets()[0].ready_unit, 1);  // completes when layer 0 is done
  EXPECT_EQ(p->buckets()[1].begin, 6);
  EXPECT_EQ(p->buckets()[1].end, 16);
  EXPECT_EQ(p->buckets()[2].begin, 0);
  EXPECT_EQ(p->buckets()[2].ready_unit, 0);
  EXPECT_TRUE(p->BucketsReadyAt(2).empty());
  EXPECT_EQ(p->BucketsReadyAt(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(p->BucketsReadyAt(0), (std::vector<int>{2}));
  // Chunks: ceil(7/2)=4, 5, 3.
  EXPECT_EQ(p->shard_size(), 12);
  EXPECT_EQ(p->buckets()[0].shard_offset, 0);
  EXPECT_EQ(p->buckets()[1].shard_offset, 4);
  EXPECT_EQ(p->buckets()[2].shard_offset, 9);
}

TEST(FlatPartitionTest, SplitAtUnitsKeepsBucketsInsideUnits) {
  PartitionOptions o;
  o.ranks = 3;
  o.bucket_floats = 1000;
  o.split_at_units = true;
  auto p = FlatPartition::Build(Tensors(), 3, o);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->buckets().size(), 3u);
  for (int64_t u = 0; u < 3; ++u) {
    ASSERT_EQ(p->BucketsInUnit(u).size(), 1u);
    EXPECT_EQ(p->BucketsReadyAt(u), p->BucketsInUnit(u));
  }
  EXPECT_EQ(p->buckets()[1].begin, 6);
  EXPECT_EQ(p->buckets()[1].end, 20);
}

TEST(FlatPartitionTest, OwnedPiecesTileEveryElementOnce) {
  for (int ranks : {1, 2, 3, 4, 7}) {
    for (int64_t cap : {1, 5, 8, 100}) {
      PartitionOptions o;
      o.ranks = ranks;
      o.bucket_floats = cap;
      auto p = FlatPartition::Build(Tensors(), 3, o);
      ASSERT_TRUE(p.ok());
      std::vector<int> seen(23, 0);
      for (int r = 0; r < ranks; ++r) {
        std::vector<bool> shard_used(p->shard_size(), false);
        for (const OwnedPiece& piece : p->OwnedPieces(r)) {
          const FlatTensor& t = p->tensors()[piece.tensor];
          EXPECT_GE(piece.flat_begin, t.offset);
          EXPECT_LE(piece.flat_begin + piece.count, t.offset + t.numel);
          for (int64_t i = 0; i < piece.count; ++i) {
            ++seen[piece.flat_begin + i];
            ASSERT_LT(piece.shard_offset + i, p->shard_size());
            EXPECT_FALSE(shard_used[piece.shard_offset + i]);
            shard_used[piece.shard_offset + i] = true;
          }
        }
      }
      for (int c : seen) EXPECT_EQ(c, 1) << "ranks " << ranks << " cap " << cap;
    }
  }
}

TEST(FlatPartitionTest, RefusesNonContiguousLayouts) {
  std::vector<FlatTensor> t = Tensors();
  t[2].offset = 17;
  EXPECT_FALSE(FlatPartition::Build(t, 3, {}).ok());
  t = Tensors();
  t[3].unit = 0;  // units must not decrease
  EXPECT_FALSE(FlatPartition::Build(t, 3, {}).ok());
}

TEST(FlatPartitionTest, UnitsOfLlamaNames) {
  EXPECT_EQ(UnitOfParameter("model.embed_tokens.weight", 4), 0);
  EXPECT_EQ(UnitOfParameter("model.layers.0.mlp.up_proj.weight", 4), 1);
  EXPECT_EQ(UnitOfParameter("model.layers.3.input_layernorm.weight", 4), 4);
  EXPECT_EQ(UnitOfParameter("model.norm.weight", 4), 5);
  EXPECT_EQ(UnitOfParameter("lm_head.weight", 4), 5);
}

// Every slice is contiguous in memory starting at flat_begin, in order, and
// the slices cover exactly the range.
void CheckSlices(const std::vector<int64_t>& shape, int64_t begin, int64_t count) {
  const std::vector<RectSlice> slices = FlatRangeToSlices(shape, begin, count);
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  int64_t next = begin;
  for (const RectSlice& s : slices) {
    ASSERT_EQ(s.offset.size(), shape.size());
    EXPECT_EQ(s.flat_begin, next);
    // Enumerate the slice's elements in row-major order: they must be next, next+1, ...
    std::vector<int64_t> idx(shape.size(), 0);
    for (int64_t e = 0; e < s.numel(); ++e) {
      int64_t flat = 0;
      for (size_t d = 0; d < shape.size(); ++d) flat += (s.offset[d] + idx[d]) * stride[d];
      ASSERT_EQ(flat, next) << "shape dims " << shape.size() << " begin " << begin;
      ++next;
      for (size_t d = shape.size(); d-- > 0;) {
        if (++idx[d] < s.shape[d]) break;
        idx[d] = 0;
      }
    }
  }
  EXPECT_EQ(next, begin + count);
  EXPECT_LE(slices.size(), 2 * shape.size() + 1);
}

TEST(FlatRangeToSlicesTest, CoversRangesOfMatricesAndCubes) {
  for (int64_t b = 0; b < 12; ++b) {
    for (int64_t c = 1; b + c <= 12; ++c) CheckSlices({3, 4}, b, c);
  }
  for (int64_t b = 0; b < 24; b += 5) {
    for (int64_t c = 1; b + c <= 24; c += 3) CheckSlices({2, 3, 4}, b, c);
  }
  CheckSlices({7}, 2, 4);
  const auto whole = FlatRangeToSlices({3, 4}, 0, 12);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].shape, (std::vector<int64_t>{3, 4}));
  const auto mid = FlatRangeToSlices({3, 4}, 2, 8);  // [0,2:4], [1,:], [2,0:2]
  ASSERT_EQ(mid.size(), 3u);
  EXPECT_EQ(mid[0].offset, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(mid[0].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(mid[1].shape, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(mid[2].shape, (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace loom::engine
