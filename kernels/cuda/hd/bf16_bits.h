// bf16 as raw 16-bit patterns, for host code that fills device buffers and for
// the CPU references (which see exactly the values the kernels read).
#pragma once

#include <cstdint>

#include "kernels/cuda/hd/hd.h"

namespace loom::kernels::cuda {

// Round to nearest, ties to even; NaN stays a (quiet) NaN. Matches
// __float2bfloat16_rn.
LOOM_HD uint16_t FloatToBf16Bits(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

LOOM_HD float Bf16BitsToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

LOOM_HD float RoundToBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }

}  // namespace loom::kernels::cuda
