// Fragment layouts of mma.sync.m16n8k16 and the ldmatrix.x4 addressing the
// kernels use, checked by simulating ldmatrix as the PTX ISA defines it: each
// lane must end up holding exactly the operand elements the mma expects.
#include "kernels/cuda/hd/mma_layout.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace loom::kernels::cuda {
namespace {

// A matrix whose element (r, c) is the value r * 1000 + c, so a loaded value
// tells where it came from.
int Val(int r, int c) { return r * 1000 + c; }

// ldmatrix.x4: lane 8j + i supplies the address of row i of 8x8 matrix j.
// Without .trans lane l receives, for matrix j, stored elements (l/4, 2(l%4))
// and (l/4, 2(l%4)+1); with .trans, stored (2(l%4), l/4) and (2(l%4)+1, l/4).
// `origin(lane)` gives the (row, col) of the array the lane points at.
template <typename Origin>
void SimulateLdmatrix(Origin origin, bool trans, int out[32][4][2]) {
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) {
        int r = trans ? 2 * (lane % 4) + h : lane / 4;   // row within matrix j
        int c = trans ? lane / 4 : 2 * (lane % 4) + h;   // col within matrix j
        RowCol base = origin(8 * j + r);                 // the lane that supplied row r
        out[lane][j][h] = Val(base.row, base.col + c);
      }
}

TEST(MmaLayout, AccumulatorCoversTheTileOnce) {
  std::set<std::pair<int, int>> seen;
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      RowCol rc = MmaAccElement(lane, i);
      EXPECT_TRUE(rc.row >= 0 && rc.row < 16 && rc.col >= 0 && rc.col < 8);
      seen.insert({rc.row, rc.col});
    }
  EXPECT_EQ(seen.size(), 128u);
}

TEST(MmaLayout, OperandsCoverTheirTilesOnce) {
  std::set<std::pair<int, int>> a, b;
  for (int lane = 0; lane < 32; ++lane)
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < 4; ++r) a.insert({MmaAElement(lane, r, h).row, MmaAElement(lane, r, h).col});
      for (int r = 0; r < 2; ++r) b.insert({MmaBElement(lane, r, h).row, MmaBElement(lane, r, h).col});
    }
  EXPECT_EQ(a.size(), 256u);
  EXPECT_EQ(b.size(), 128u);
  EXPECT_EQ(a.rbegin()->first, 15);
  EXPECT_EQ(b.rbegin()->first, 15);
}

TEST(MmaLayout, AccumulatorPairsFormAnAFragment) {
  // The attention kernels feed P (accumulator layout of two adjacent n-tiles)
  // straight back as the A operand of the next mma: A register r, half h, is
  // n-tile (r / 2), accumulator element 2 * (r % 2) + h.
  for (int lane = 0; lane < 32; ++lane)
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) {
        RowCol a = MmaAElement(lane, r, h);
        RowCol c = MmaAccElement(lane, 2 * (r % 2) + h);
        EXPECT_EQ(a.row, c.row);
        EXPECT_EQ(a.col, c.col + 8 * (r / 2));
      }
}

TEST(Ldmatrix, AFromRowMajor) {
  int got[32][4][2];
  SimulateLdmatrix([](int lane) { return LdmatrixA(lane); }, false, got);
  for (int lane = 0; lane < 32; ++lane)
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) {
        RowCol e = MmaAElement(lane, r, h);  // (m, k) in a [m][k] array
        EXPECT_EQ(got[lane][r][h], Val(e.row, e.col)) << lane << " " << r << " " << h;
      }
}

TEST(Ldmatrix, ATransposedFromKMajor) {
  int got[32][4][2];
  SimulateLdmatrix([](int lane) { return LdmatrixATrans(lane); }, true, got);
  for (int lane = 0; lane < 32; ++lane)
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) {
        RowCol e = MmaAElement(lane, r, h);  // (m, k), stored at [k][m]
        EXPECT_EQ(got[lane][r][h], Val(e.col, e.row)) << lane << " " << r << " " << h;
      }
}

TEST(Ldmatrix, BFromNkArray) {
  int got[32][4][2];
  SimulateLdmatrix([](int lane) { return LdmatrixBNk(lane); }, false, got);
  for (int lane = 0; lane < 32; ++lane)
    for (int reg = 0; reg < 4; ++reg)
      for (int h = 0; h < 2; ++h) {
        RowCol e = MmaBElement(lane, reg % 2, h);  // (k, n)
        int n = e.col + 8 * (reg / 2);
        EXPECT_EQ(got[lane][reg][h], Val(n, e.row)) << lane << " " << reg << " " << h;
      }
}

TEST(Ldmatrix, BTransposedFromKnArray) {
  int got[32][4][2];
  SimulateLdmatrix([](int lane) { return LdmatrixBKnTrans(lane); }, true, got);
  for (int lane = 0; lane < 32; ++lane)
    for (int reg = 0; reg < 4; ++reg)
      for (int h = 0; h < 2; ++h) {
        RowCol e = MmaBElement(lane, reg % 2, h);  // (k, n), stored at [k][n]
        int n = e.col + 8 * (reg / 2);
        EXPECT_EQ(got[lane][reg][h], Val(e.row, n)) << lane << " " << reg << " " << h;
      }
}

}  // namespace
}  // namespace loom::kernels::cuda
