// FP8 e4m3 (the "fn" variant: no infinities, one NaN pattern per sign) and the
// DeepSeek-V3 block scales, as bit-exact host/device functions. The kernels
// quantize with the hardware conversion; the GPU tests check it against
// FloatToE4m3 here, and the host tests check FloatToE4m3 against the format.
#pragma once

#include <cstdint>

#include "kernels/cuda/hd/hd.h"

namespace loom::kernels::cuda {

inline constexpr float kE4m3Max = 448.0f;
// Activations are quantized in 1 x kFp8Tile tiles, weights in kFp8Tile^2 blocks.
inline constexpr int kFp8Tile = 128;
// Floor on a block's absolute maximum so that an all-zero (or denormal) block
// gets a finite scale and finite inverse instead of 0 and inf (which would
// turn 0 * inf into NaN).
inline constexpr float kFp8MinAmax = 1e-12f;

// Round to nearest, ties to even, saturating: finite values and infinities
// beyond +-448 become +-448 (never NaN from overflow); NaN stays NaN (0x7f
// with its sign). Same contract as cvt.rn.satfinite.e4m3x2.f32.
LOOM_HD uint8_t FloatToE4m3(float f) {
  uint32_t u = FloatToBits(f);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN
  float af = BitsToFloat(a);
  if (af < 0.015625f) {  // below 2^-6: the subnormal grid, steps of 2^-9
    // af * 512 is exact; adding 2^23 rounds it to an integer, ties to even.
    float scaled = MulRn(af, 512.0f);
#if defined(__CUDA_ARCH__)
    float rounded = __fsub_rn(__fadd_rn(scaled, 8388608.0f), 8388608.0f);
#else
    volatile float t = scaled + 8388608.0f;  // volatile: keep the rounding step
    float rounded = t - 8388608.0f;
#endif
    // 8 * 2^-9 == 2^-6 is code 0x08, the smallest normal: the codes line up.
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(rounded));
  }
  if (af >= kE4m3Max) return static_cast<uint8_t>(sign | 0x7eu);
  // Normal: keep 3 mantissa bits, ties to even, then rebias 127 -> 7. A carry
  // out of the mantissa bumps the exponent, which is the correct result.
  uint32_t rounded = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  uint32_t code = rounded - (120u << 3);
  if (code > 0x7eu) code = 0x7eu;  // 448 < x < 464 rounds to 448 anyway; 0x7f is NaN
  return static_cast<uint8_t>(sign | code);
}

LOOM_HD float E4m3ToFloat(uint8_t b) {
  uint32_t sign = (b & 0x80u) ? 0x80000000u : 0u;
  uint32_t e = (b >> 3) & 0xfu;
  uint32_t m = b & 0x7u;
  if (e == 0xfu && m == 0x7u) return BitsToFloat(sign | 0x7fc00000u);
  if (e == 0) {
    float v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((e + 120u) << 23) | (m << 20));
}

// The scale of one tile or block: dequantized value = e4m3 * scale, and the
// quantizer multiplies by inv_scale. Both correctly rounded so host and device
// agree to the bit.
struct Fp8Scale {
  float scale;
  float inv_scale;
};

LOOM_HD Fp8Scale ComputeFp8Scale(float amax) {
  float a = amax > kFp8MinAmax ? amax : kFp8MinAmax;  // NaN amax also takes the floor
  return Fp8Scale{DivRn(a, kE4m3Max), DivRn(kE4m3Max, a)};
}

LOOM_HD uint8_t QuantizeE4m3(float x, float inv_scale) { return FloatToE4m3(MulRn(x, inv_scale)); }

}  // namespace loom::kernels::cuda
