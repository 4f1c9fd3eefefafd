// Which element of a warp-level mma.sync.m16n8k16 (bf16 in, fp32 out) each
// lane holds, and which rows the lanes of an ldmatrix.x4 must point at, per
// the PTX ISA's fragment layouts. The kernels use these for masking, epilogues
// and addressing; the host tests check they cover each tile exactly once.
#pragma once

#include "kernels/cuda/hd/hd.h"

namespace loom::kernels::cuda {

struct RowCol {
  int row;
  int col;
};

// Accumulator C/D (16 x 8 fp32): element i in [0, 4) of lane.
LOOM_HD RowCol MmaAccElement(int lane, int i) {
  return RowCol{(lane >> 2) + ((i >> 1) << 3), ((lane & 3) << 1) + (i & 1)};
}

// Operand A (16 x 16, row-major): register r in [0, 4), half h in {0, 1}.
LOOM_HD RowCol MmaAElement(int lane, int r, int h) {
  return RowCol{(lane >> 2) + ((r & 1) << 3), ((lane & 3) << 1) + h + ((r >> 1) << 3)};
}

// Operand B (16 x 8, k x n): register r in {0, 1}, half h; row = k, col = n.
LOOM_HD RowCol MmaBElement(int lane, int r, int h) {
  return RowCol{((lane & 3) << 1) + h + (r << 3), lane >> 2};
}

// ldmatrix.x4 feeding an A fragment of the 16x16 tile at (0, 0) of a
// row-major [m][k] array: the (row, col) whose address lane supplies.
LOOM_HD RowCol LdmatrixA(int lane) { return RowCol{(lane & 7) + (((lane >> 3) & 1) << 3), (lane >> 4) << 3}; }

// ldmatrix.x4 (no .trans) feeding the B fragments of two adjacent n-tiles
// (n 0..15, k 0..15) from a [n][k] array (k contiguous): registers 0,1 are the
// first n-tile's b0,b1 and 2,3 the second's. Returns (n, k).
LOOM_HD RowCol LdmatrixBNk(int lane) { return RowCol{(lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) << 3}; }

// ldmatrix.x4.trans feeding the B fragments of two adjacent n-tiles from a
// [k][n] array (n contiguous). Returns (k, n).
LOOM_HD RowCol LdmatrixBKnTrans(int lane) { return RowCol{(lane & 7) + (((lane >> 3) & 1) << 3), (lane >> 4) << 3}; }

// ldmatrix.x4.trans feeding an A fragment (m 0..15, k 0..15) from a [k][m]
// array (m contiguous), i.e. A = X^T for X stored [k][m]. Returns (k, m).
LOOM_HD RowCol LdmatrixATrans(int lane) { return RowCol{(lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) << 3}; }

}  // namespace loom::kernels::cuda
